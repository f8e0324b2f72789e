package plan

import (
	"strconv"
	"strings"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

// StoreRef names one worker's store in the annotations that record where a series' data is:
// MEDIA/NODE in revault.io/placement and revault.io/moving-to, MEDIA/NODE@N in
// revault.io/moved-from (N: the newest version both workers listed at a move's switch).
type StoreRef struct {
	Media backupv1alpha1.Media
	Node  string
}

func (s StoreRef) String() string { return string(s.Media) + "/" + s.Node }

// StoreOf is the store a placement names.
func StoreOf(p *backupv1alpha1.WorkerPlacement) StoreRef {
	return StoreRef{Media: p.Media, Node: p.Node}
}

// ParseStoreRef reads MEDIA/NODE; false for anything else (no slash, no node).
func ParseStoreRef(v string) (StoreRef, bool) {
	media, node, ok := strings.Cut(v, "/")
	if !ok || media == "" || node == "" || strings.Contains(node, "/") {
		return StoreRef{}, false
	}
	return StoreRef{Media: backupv1alpha1.Media(media), Node: node}, true
}

// MovedFrom is the revault.io/moved-from value of a switch from s, N being through.
func MovedFrom(s StoreRef, through int64) string {
	return s.String() + "@" + strconv.FormatInt(through, 10)
}

// ParseMovedFrom reads MEDIA/NODE@N; false for anything else.
func ParseMovedFrom(v string) (StoreRef, int64, bool) {
	ref, n, ok := strings.Cut(v, "@")
	s, sok := ParseStoreRef(ref)
	through, err := strconv.ParseInt(n, 10, 64)
	if !ok || !sok || err != nil || through < 0 {
		return StoreRef{}, 0, false
	}
	return s, through, true
}

// StoreOfRecord is the store an annotation value of either form names (the part before any @).
func StoreOfRecord(v string) (StoreRef, bool) {
	ref, _, _ := strings.Cut(v, "@")
	return ParseStoreRef(ref)
}
