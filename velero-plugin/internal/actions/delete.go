package actions

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/revault-io/revault/operator/pkg/workerclient"
	"github.com/revault-io/revault/velero-plugin/internal/kube"
)

// PVCDelete is the DeleteItemAction `revault.io/pvc-delete`: when a Velero backup is deleted, the
// Revault versions it made are expired on their workers, so `velero backup delete` frees the
// space. It handles the backed-up BackupSeries (versions made by revault.io/pvc-backup, recorded
// when the backup finalized) and the DataUploads of the revault data mover (snapshot IDs
// NAMESPACE/SERIES@VERSION).
type PVCDelete struct {
	Log logrus.FieldLogger
}

// AppliesTo selects BackupSeries and DataUploads.
func (a *PVCDelete) AppliesTo() (velero.ResourceSelector, error) {
	return velero.ResourceSelector{IncludedResources: []string{"backupseries.backup.revault.io", "datauploads.velero.io"}}, nil
}

// ParseSnapshotID reads the data mover's snapshot ID NAMESPACE/SERIES@VERSION.
func ParseSnapshotID(id string) (ns, series string, version int64, ok bool) {
	name, v, found := strings.Cut(id, "@")
	if !found {
		return "", "", 0, false
	}
	ns, series, found = strings.Cut(name, "/")
	version, err := strconv.ParseInt(v, 10, 64)
	if !found || ns == "" || series == "" || err != nil || version < 1 {
		return "", "", 0, false
	}
	return ns, series, version, true
}

// Execute expires the version an item records.
func (a *PVCDelete) Execute(in *velero.DeleteItemActionExecuteInput) error {
	u := &unstructured.Unstructured{Object: in.Item.UnstructuredContent()}
	var ns, series, hint string
	var version int64
	switch u.GetKind() {
	case "BackupSeries":
		v, recorded, err := recordedVersion(u)
		if !recorded {
			return err
		}
		ns, series, version, hint = u.GetNamespace(), u.GetName(), v, u.GetAnnotations()[kube.AnnWorker]
	case "DataUpload":
		mover, _, _ := unstructured.NestedString(u.Object, "spec", "datamover")
		id, _, _ := unstructured.NestedString(u.Object, "status", "snapshotID")
		if mover != "revault" || id == "" {
			return nil
		}
		var ok bool
		if ns, series, version, ok = ParseSnapshotID(id); !ok {
			return fmt.Errorf("DataUpload %s: snapshot ID %q is not NAMESPACE/SERIES@VERSION", u.GetName(), id)
		}
		hint, _, _ = unstructured.NestedString(u.Object, "status", "dataMoverResult", "worker")
	default:
		return nil
	}
	c, err := kube.Client()
	if err != nil {
		return err
	}
	ctx, cancel := apiCtx()
	defer cancel()
	log := a.Log.WithFields(logrus.Fields{"series": ns + "/" + series, "version": version, "backup": in.Backup.Name})
	wc, err := workerClient(ctx, c, ns, series, hint)
	if err != nil {
		return fmt.Errorf("expiring version %d of series %s/%s (backup %s): %w; the version stays on its worker until expired by hand (DELETE /v1/series/%s/%s/versions/%d)",
			version, ns, series, in.Backup.Name, err, ns, series, version)
	}
	if err := workerclient.Done(wc.DeleteVersionWithResponse(ctx, ns, series, strconv.FormatInt(version, 10))); err != nil {
		if workerclient.IsNotFound(err) {
			log.Info("the version was already gone")
			return nil
		}
		return fmt.Errorf("expiring version %d of series %s/%s: %w", version, ns, series, err)
	}
	log.Info("expired the Revault version of the deleted backup")
	return nil
}
