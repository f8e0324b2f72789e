package actions

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sirupsen/logrus"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/velero-plugin/internal/kube"
)

// PVCBackup is the BackupItemAction v2 `revault.io/pvc-backup`. For a selected PVC it asks the
// operator for an on-demand backup of the PVC's series (annotation revault.io/backup-now on its
// BackupSeries, created if the PVC has none), records the series and the request in the
// backed-up PVC, and returns an operation ID; Progress follows the request in the BackupSeries'
// status.backupNow.
//
// The series' BackupSeries goes into the backup with the PVC and is the operation's
// post-operation item: when the backup finalizes, Execute runs on it again and records the
// version the request made (and the PVC and worker) in its backed-up copy, where the restore and
// delete actions find it. (The PVC cannot be the post-operation item: Velero 1.18 backs a bound
// PVC's volume up again when finalizing, and its finalizer cannot take volume snapshots.)
//
// Execute returns only once the Job has read the volume (or the request ended otherwise): Velero
// runs a pod's post hooks (an unfreeze, `pg_backup_stop`) as soon as the actions on the pod's
// item block return, without waiting for asynchronous operations, and the Job reads the live
// volume. So the data is read between the pre and the post hooks, as with Velero's own file
// system backup; the operation is then already complete, and Progress reports its outcome.
type PVCBackup struct {
	Log logrus.FieldLogger
	// Poll is how often Execute looks at the request while it waits (0: every 2 s), and
	// StartTimeout how long it waits for the operator to start the request (0: 10 minutes).
	Poll, StartTimeout time.Duration
}

// defaultItemOperationTimeout is Velero's default for spec.itemOperationTimeout, the longest
// Execute waits for the volume to be read.
const defaultItemOperationTimeout = 4 * time.Hour

// defaultStartTimeout bounds the wait for the operator to start a request: placing a series and
// loading its namespace's token take seconds to about a minute.
const defaultStartTimeout = 10 * time.Minute

// Name is the registered name (Velero answers it itself).
func (a *PVCBackup) Name() string { return "revault.io/pvc-backup" }

// AppliesTo selects PVCs (Execute checks the revault.io/velero label or annotation), PVs
// (marked when their claim is such a PVC) and BackupSeries (annotated when finalizing).
func (a *PVCBackup) AppliesTo() (velero.ResourceSelector, error) {
	return velero.ResourceSelector{IncludedResources: []string{
		"persistentvolumeclaims", "persistentvolumes", "backupseries.backup.revault.io"}}, nil
}

func finalizing(b *velerov1.Backup) bool {
	return b.Status.Phase == velerov1.BackupPhaseFinalizing || b.Status.Phase == velerov1.BackupPhaseFinalizingPartiallyFailed
}

// seriesResource identifies a BackupSeries as a Velero item.
func seriesResource(ns, name string) velero.ResourceIdentifier {
	return velero.ResourceIdentifier{GroupResource: schema.GroupResource{Group: backupv1alpha1.GroupVersion.Group, Resource: "backupseries"},
		Namespace: ns, Name: name}
}

// BackupRequest is the backup-now value of a Velero backup: unique per backup.
func BackupRequest(b *velerov1.Backup) string {
	uid := string(b.UID)
	if len(uid) > 8 {
		uid = uid[:8]
	}
	if uid == "" {
		return "velero-" + b.Name
	}
	return "velero-" + b.Name + "-" + uid
}

// Execute starts the backup of a selected PVC, marks PVs, and when the backup finalizes records
// the version in the backed-up BackupSeries.
func (a *PVCBackup) Execute(item runtime.Unstructured, backup *velerov1.Backup) (
	runtime.Unstructured, []velero.ResourceIdentifier, string, []velero.ResourceIdentifier, error) {
	switch item.GetObjectKind().GroupVersionKind().Kind {
	case "PersistentVolume":
		out, err := a.markVolume(item)
		return out, nil, "", nil, err
	case "BackupSeries":
		out, err := a.recordVersion(item, backup)
		return out, nil, "", nil, err
	}
	pvc, err := toPVC(item)
	if err != nil {
		return nil, nil, "", nil, err
	}
	if !selected(pvc) || finalizing(backup) {
		return item, nil, "", nil, nil
	}
	c, err := kube.Client()
	if err != nil {
		return nil, nil, "", nil, err
	}
	ctx, cancel := apiCtx()
	defer cancel()
	request := BackupRequest(backup)
	log := a.Log.WithFields(logrus.Fields{"pvc": pvc.Namespace + "/" + pvc.Name, "backup": backup.Name})

	bs, err := seriesOf(ctx, c, pvc)
	if err != nil {
		return nil, nil, "", nil, err
	}
	if bs == nil {
		media := backupv1alpha1.Media(pvc.Annotations[kube.Media])
		if media == "" {
			media = backupv1alpha1.MediaSSD
		}
		bs = &backupv1alpha1.BackupSeries{
			ObjectMeta: metav1.ObjectMeta{Name: pvc.Name, Namespace: pvc.Namespace,
				Labels: map[string]string{"app.kubernetes.io/managed-by": kube.ManagedBy}},
			Spec: backupv1alpha1.BackupSeriesSpec{
				Source:         backupv1alpha1.BackupSource{PVC: &backupv1alpha1.PVCSource{ClaimName: pvc.Name}},
				Storage:        backupv1alpha1.StorageSpec{Media: media},
				DeletionPolicy: backupv1alpha1.DeletionRetain,
			},
		}
		if err := c.Create(ctx, bs); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return nil, nil, "", nil, fmt.Errorf("BackupSeries %s/%s exists but does not back up PVC %s", pvc.Namespace, pvc.Name, pvc.Name)
			}
			return nil, nil, "", nil, fmt.Errorf("creating BackupSeries %s/%s: %w", pvc.Namespace, pvc.Name, err)
		}
		log.Info("created a BackupSeries for the PVC")
	}
	if bs.Annotations[backupv1alpha1.BackupNowAnnotation] != request {
		patch := client.MergeFrom(bs.DeepCopy())
		if bs.Annotations == nil {
			bs.Annotations = map[string]string{}
		}
		bs.Annotations[backupv1alpha1.BackupNowAnnotation] = request
		if err := c.Patch(ctx, bs, patch); err != nil {
			return nil, nil, "", nil, fmt.Errorf("requesting a backup of BackupSeries %s/%s: %w", bs.Namespace, bs.Name, err)
		}
	}
	log.WithField("series", bs.Namespace+"/"+bs.Name).Info("requested a Revault backup of the volume")
	operationID := bs.Namespace + "/" + bs.Name + "/" + request
	if err := a.waitRead(operationID, backup); err != nil {
		return nil, nil, "", nil, err
	}

	u := annotated(item, map[string]string{
		kube.AnnSeries: bs.Name, kube.AnnRequest: request, kube.AnnMedia: string(bs.Spec.Storage.Media),
		// The BackupSeries carries the version: it must be in the backup even when the backup's
		// resource filters leave custom resources out.
		velerov1.MustIncludeAdditionalItemAnnotation: "true",
	})
	series := seriesResource(bs.Namespace, bs.Name)
	return u, []velero.ResourceIdentifier{series}, operationID, []velero.ResourceIdentifier{series}, nil
}

// waitRead waits until the backup request has ended (its Job read the volume and committed, or it
// failed: Progress reports which), at most the backup's item operation timeout. A request the
// operator has not started within startTimeout (the series cannot be placed, its token is not
// loaded) fails sooner: every Velero backup waits behind this one, and the pod's pre hook (a
// freeze) holds meanwhile. A failed status read is retried until the deadline.
func (a *PVCBackup) waitRead(operationID string, backup *velerov1.Backup) error {
	limit := backup.Spec.ItemOperationTimeout.Duration
	if limit <= 0 {
		limit = defaultItemOperationTimeout
	}
	poll, startLimit := a.Poll, a.StartTimeout
	if poll <= 0 {
		poll = 2 * time.Second
	}
	if startLimit <= 0 {
		startLimit = defaultStartTimeout
	}
	startLimit = min(startLimit, limit)
	begun := time.Now()
	deadline, startBy := begun.Add(limit), begun.Add(startLimit)
	for {
		p, err := a.Progress(operationID, backup)
		switch {
		case err == nil && p.Completed:
			return nil
		case err == nil && p.Started.IsZero() && time.Now().After(startBy):
			return fmt.Errorf("the Revault backup %s was not started within %s (%s): the volume must be read before the pod's post hooks run",
				operationID, startLimit, p.Description)
		case time.Now().After(deadline):
			last := p.Description
			if err != nil {
				last = err.Error()
			}
			return fmt.Errorf("the Revault backup %s did not finish within %s (the backup's itemOperationTimeout): "+
				"the volume must be read before the pod's post hooks run (last state: %s)", operationID, limit, last)
		case err != nil:
			a.Log.WithError(err).WithField("operation", operationID).Warn("reading the backup request's state; retrying")
		}
		time.Sleep(poll)
	}
}

// recordVersion annotates the backed-up copy of a BackupSeries, when the Velero backup
// finalizes, with the version its request made (a BackupSeries backed up for other reasons, or
// whose request failed, is left as it is).
func (a *PVCBackup) recordVersion(item runtime.Unstructured, backup *velerov1.Backup) (runtime.Unstructured, error) {
	if !finalizing(backup) {
		return item, nil
	}
	bs := &backupv1alpha1.BackupSeries{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.UnstructuredContent(), bs); err != nil {
		return nil, fmt.Errorf("reading the BackupSeries item: %w", err)
	}
	request := BackupRequest(backup)
	e := entry(bs, request)
	if e == nil {
		return item, nil
	}
	log := a.Log.WithFields(logrus.Fields{"series": bs.Namespace + "/" + bs.Name, "backup": backup.Name})
	if e.Phase != backupv1alpha1.BackupNowSucceeded || e.Version == 0 || bs.Spec.Source.PVC == nil {
		log.Warn("the volume's backup did not succeed: the backup records no Revault version")
		return item, nil
	}
	ann := map[string]string{
		kube.AnnRequest: request,
		kube.AnnVersion: strconv.FormatInt(e.Version, 10),
		kube.AnnPVC:     bs.Spec.Source.PVC.ClaimName,
	}
	if bs.Status.Worker != nil {
		ann[kube.AnnWorker] = bs.Status.Worker.Endpoint
	}
	u := annotated(item, ann)
	log.WithField("version", e.Version).Info("recorded the Revault version in the backup")
	return u, nil
}

// markVolume annotates the backed-up copy of a PV whose claim is backed up into Revault
// (revault.io/velero-data: NAMESPACE/PVC). On restore, revault.io/pvc-restore leaves such a PV
// out: the data comes back from Revault into a new volume, and the old PV (Velero would
// recreate it as it was when its reclaim policy is Retain) would point at stale or foreign data.
func (a *PVCBackup) markVolume(item runtime.Unstructured) (runtime.Unstructured, error) {
	pv := &corev1.PersistentVolume{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(item.UnstructuredContent(), pv); err != nil {
		return nil, fmt.Errorf("reading the PV item: %w", err)
	}
	ref := pv.Spec.ClaimRef
	if ref == nil || ref.Namespace == "" || ref.Name == "" {
		return item, nil
	}
	c, err := kube.Client()
	if err != nil {
		return nil, err
	}
	ctx, cancel := apiCtx()
	defer cancel()
	pvc := &corev1.PersistentVolumeClaim{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, pvc); err != nil {
		if apierrors.IsNotFound(err) {
			return item, nil
		}
		return nil, fmt.Errorf("PV %s: reading its claim %s/%s: %w", pv.Name, ref.Namespace, ref.Name, err)
	}
	if !selected(pvc) || (ref.UID != "" && ref.UID != pvc.UID) {
		return item, nil
	}
	return annotated(item, map[string]string{kube.AnnData: ref.Namespace + "/" + ref.Name}), nil
}

// seriesOf is the BackupSeries backing up pvc (the one named after it first), or nil.
func seriesOf(ctx context.Context, c client.Client, pvc *corev1.PersistentVolumeClaim) (*backupv1alpha1.BackupSeries, error) {
	var list backupv1alpha1.BackupSeriesList
	if err := c.List(ctx, &list, client.InNamespace(pvc.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the BackupSeries of namespace %s: %w", pvc.Namespace, err)
	}
	var found *backupv1alpha1.BackupSeries
	for i := range list.Items {
		bs := &list.Items[i]
		if bs.Spec.Source.PVC != nil && bs.Spec.Source.PVC.ClaimName == pvc.Name && (found == nil || bs.Name == pvc.Name) {
			found = bs
		}
	}
	return found, nil
}

func entry(bs *backupv1alpha1.BackupSeries, request string) *backupv1alpha1.BackupNowResult {
	for i := range bs.Status.BackupNow {
		if bs.Status.BackupNow[i].Request == request {
			return &bs.Status.BackupNow[i]
		}
	}
	return nil
}

func (a *PVCBackup) lookup(ctx context.Context, c client.Client, operationID string) (*backupv1alpha1.BackupSeries, string, error) {
	p, err := splitID(operationID, 3)
	if err != nil {
		return nil, "", err
	}
	bs := &backupv1alpha1.BackupSeries{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: p[0], Name: p[1]}, bs); err != nil {
		return nil, "", fmt.Errorf("operation %s: reading BackupSeries %s/%s: %w", operationID, p[0], p[1], err)
	}
	return bs, p[2], nil
}

// Progress reports the on-demand backup: bytes read so far, then the outcome.
func (a *PVCBackup) Progress(operationID string, backup *velerov1.Backup) (velero.OperationProgress, error) {
	c, err := kube.Client()
	if err != nil {
		return velero.OperationProgress{}, err
	}
	ctx, cancel := apiCtx()
	defer cancel()
	bs, request, err := a.lookup(ctx, c, operationID)
	if err != nil {
		return velero.OperationProgress{}, err
	}
	p := velero.OperationProgress{OperationUnits: "Bytes"}
	if bs.Spec.Source.PVC != nil {
		pvc := &corev1.PersistentVolumeClaim{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: bs.Namespace, Name: bs.Spec.Source.PVC.ClaimName}, pvc); err == nil {
			p.NTotal = pvc.Spec.Resources.Requests.Storage().Value()
		}
	}
	e := entry(bs, request)
	if e == nil {
		if bs.Annotations[backupv1alpha1.BackupNowAnnotation] != request && bs.Status.LastBackupNow != request {
			p.Completed, p.Err = true, fmt.Sprintf("the backup request %s on BackupSeries %s/%s was replaced by %q before the operator started it",
				request, bs.Namespace, bs.Name, bs.Annotations[backupv1alpha1.BackupNowAnnotation])
			return p, nil
		}
		p.Description = "waiting for the operator to start the backup (series placement, namespace token)"
		return p, nil
	}
	if e.StartTime != nil {
		p.Started = e.StartTime.Time
	}
	p.Updated = time.Now()
	p.NCompleted = e.LogicalBytes
	switch e.Phase {
	case backupv1alpha1.BackupNowRunning:
		p.Description = "Job " + e.Job + " is backing up the volume"
	case backupv1alpha1.BackupNowSucceeded:
		p.Completed, p.NTotal = true, e.LogicalBytes
		if e.CompletionTime != nil {
			p.Updated = e.CompletionTime.Time
		}
		if e.Version == 0 {
			p.Err = "the backup ran but its version is unknown: " + e.Message
		} else {
			p.Description = fmt.Sprintf("version %d of series %s/%s", e.Version, bs.Namespace, bs.Name)
		}
	case backupv1alpha1.BackupNowFailed:
		p.Completed, p.Err = true, fmt.Sprintf("Revault backup of series %s/%s failed: %s", bs.Namespace, bs.Name, e.Message)
	}
	return p, nil
}

// Cancel stops the backup Job (the operator then records the request as failed).
func (a *PVCBackup) Cancel(operationID string, backup *velerov1.Backup) error {
	c, err := kube.Client()
	if err != nil {
		return err
	}
	ctx, cancel := apiCtx()
	defer cancel()
	bs, request, err := a.lookup(ctx, c, operationID)
	if err != nil {
		return err
	}
	e := entry(bs, request)
	if e == nil || e.Phase != backupv1alpha1.BackupNowRunning || e.Job == "" {
		return nil
	}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: bs.Namespace, Name: e.Job}}
	if err := c.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
		return err
	}
	a.Log.WithField("job", bs.Namespace+"/"+e.Job).Info("canceled the Revault backup Job")
	return nil
}
