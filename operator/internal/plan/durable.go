package plan

import (
	"fmt"
	"strings"
	"time"
)

// Durability is what the Durable condition of a series says: whether the worker's remote holds
// the series' newest version.
type Durability struct {
	OK      bool
	Reason  string
	Message string
}

// DurabilityOf decides the Durable condition (reason InTime while the bucket keeps up: one
// reason, so a backup and its upload do not each add an event) from the newest version (latest, backed up at
// lastBackup) and the newest one the remote holds (durable; 0 for none). A version the bucket
// does not hold yet is normal for a while — the worker uploads in the background — so the
// condition turns False (RemoteBehind) only once the newest version is older than behindAfter.
func DurabilityOf(latest, durable int64, lastBackup time.Time, now time.Time, behindAfter time.Duration) Durability {
	switch {
	case latest == 0:
		return Durability{true, "NoVersions", "nothing to upload yet"}
	case durable >= latest:
		return Durability{true, "InTime", fmt.Sprintf("the remote holds version %d, the newest", latest)}
	}
	held := "no version"
	if durable > 0 {
		held = fmt.Sprintf("version %d", durable)
	}
	age := now.Sub(lastBackup)
	if age < behindAfter {
		return Durability{true, "InTime", fmt.Sprintf("the remote holds %s; version %d (backed up %s ago) is being uploaded", held, latest, age.Round(time.Second))}
	}
	return Durability{false, "RemoteBehind", fmt.Sprintf(
		"the remote holds %s, the newest is version %d, backed up %s ago (more than %s): check the worker's revault_remote_lag_seconds and the bucket",
		held, latest, age.Round(time.Second), behindAfter)}
}

// StoreSeries is what adoption needs to know of a series placed on a lost node's store.
type StoreSeries struct {
	Name            string
	Latest, Durable int64
}

// AdoptionHold says why the store of a lost node must not be rebuilt elsewhere yet, or "" when
// it may be. A rebuilt store serves what the bucket holds: versions the worker acknowledged but
// had not uploaded stay on the lost node. A node that is only NotReady may come back with them
// (a kubelet upgrade, a partition), so its store is adopted only once the bucket holds every
// version of every series placed there; until then it waits for the node, or for someone to
// delete the Node — the decision that it is gone. A node that is gone took them with it; its
// store is rebuilt if the bucket holds anything of it (a store rebuilt from nothing would serve
// an empty history under its series' names).
func AdoptionHold(series []StoreSeries, gone bool) string {
	anything := false
	var behind []string
	for _, s := range series {
		if s.Durable > 0 {
			anything = true
		}
		if s.Latest > s.Durable {
			behind = append(behind, fmt.Sprintf("%s (versions %d to %d)", s.Name, s.Durable+1, s.Latest))
		}
	}
	switch {
	case len(series) > 0 && !anything:
		return "the remote holds no version of any series placed there yet: a store rebuilt from it would be empty"
	case !gone && len(behind) > 0:
		return fmt.Sprintf("the remote does not hold every version yet: %s; waiting for the node to come back, "+
			"or delete its Node to rebuild the store without them", strings.Join(behind, ", "))
	}
	return ""
}
