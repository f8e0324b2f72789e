package actions

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/velero-plugin/internal/kube"
	"github.com/revault-io/revault/velero-plugin/internal/testutil"
)

// The actions run against a real kube-apiserver with the operator's CRDs (envtest) and a real
// worker; the tests play the operator where the actions wait for it (status of BackupSeries
// and RestoreJobs), as the operator's own envtest suite checks it writes them.

func toUnstructured(t *testing.T, obj runtime.Object) *unstructured.Unstructured {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func pvc(ns, name string, selected bool) *corev1.PersistentVolumeClaim {
	p := &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			VolumeName:  "pv-old",
		},
	}
	if selected {
		p.Labels = map[string]string{kube.Select: "true"}
	}
	return p
}

func mustGet(t *testing.T, c client.Client, ns, name string, obj client.Object) {
	t.Helper()
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, obj); err != nil {
		t.Fatal(err)
	}
}

func setBackupNow(t *testing.T, c client.Client, ns, name string, e backupv1alpha1.BackupNowResult) {
	t.Helper()
	testutil.Eventually(t, "the status update", func() error {
		bs := &backupv1alpha1.BackupSeries{}
		if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, bs); err != nil {
			return err
		}
		bs.Status.LastBackupNow = e.Request
		bs.Status.BackupNow = []backupv1alpha1.BackupNowResult{e}
		bs.Status.Worker = &backupv1alpha1.WorkerPlacement{Media: "ssd", Node: "n1", Endpoint: "http://worker.example:8420"}
		return c.Status().Update(context.Background(), bs)
	})
}

func TestBackupActionRequestsABackupAndRecordsTheVersion(t *testing.T) {
	api := testutil.StartAPI(t)
	ctx := context.Background()
	api.Namespace(t, "app")
	a := &PVCBackup{Log: logrus.New(), Poll: 50 * time.Millisecond}
	backup := &velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "velero", UID: "0123456789abcdef"}}
	backup.Status.Phase = velerov1.BackupPhaseInProgress

	sel, _ := a.AppliesTo()
	if strings.Join(sel.IncludedResources, ",") != "persistentvolumeclaims,persistentvolumes,backupseries.backup.revault.io" {
		t.Fatalf("AppliesTo: %+v", sel)
	}

	// A PVC that did not ask for Revault is left alone.
	item, extra, op, post, err := a.Execute(toUnstructured(t, pvc("app", "cache", false)), backup)
	if err != nil || op != "" || extra != nil || post != nil || item == nil {
		t.Fatalf("unselected PVC: %v %q %v", err, op, post)
	}
	var list backupv1alpha1.BackupSeriesList
	if err := api.Client.List(ctx, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Fatal("no BackupSeries for an unselected PVC")
	}

	// A selected PVC gets a BackupSeries and an on-demand backup request.
	data := pvc("app", "data", true)
	data.Annotations[kube.Media] = "hdd"
	if err := api.Client.Create(ctx, data.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	// Execute returns only once the volume was read: Velero runs the pod's post hooks then.
	returned := testutil.ExecuteAsync(a, toUnstructured(t, data), backup)
	request := "velero-nightly-01234567"
	op = "app/data/" + request
	bs := &backupv1alpha1.BackupSeries{}
	testutil.Eventually(t, "the backup request on a new BackupSeries", func() error {
		if err := api.Client.Get(ctx, types.NamespacedName{Namespace: "app", Name: "data"}, bs); err != nil {
			return err
		}
		if bs.Annotations[backupv1alpha1.BackupNowAnnotation] != request {
			return fmt.Errorf("backup-now: %v", bs.Annotations)
		}
		return nil
	})
	if bs.Spec.Source.PVC.ClaimName != "data" || bs.Spec.Storage.Media != "hdd" || bs.Spec.DeletionPolicy != backupv1alpha1.DeletionRetain {
		t.Fatalf("series spec: %+v", bs.Spec)
	}
	// The PV of a selected PVC is marked in the backup (not restored later); other PVs are not.
	claimed := &corev1.PersistentVolumeClaim{}
	mustGet(t, api.Client, "app", "data", claimed)
	volume := func(name, claim string, uid types.UID) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PersistentVolumeSpec{ClaimRef: &corev1.ObjectReference{
				Kind: "PersistentVolumeClaim", Namespace: "app", Name: claim, UID: uid}},
		}
	}
	for _, c := range []struct {
		pv   *corev1.PersistentVolume
		mark string
	}{
		{volume("pv-data", "data", claimed.UID), "app/data"},
		{volume("pv-stale", "data", "an-older-claim"), ""},
		{volume("pv-cache", "cache", ""), ""},
		{&corev1.PersistentVolume{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
			ObjectMeta: metav1.ObjectMeta{Name: "pv-free"}}, ""},
	} {
		out, extra, op, post, err := a.Execute(toUnstructured(t, c.pv), backup)
		if err != nil || op != "" || extra != nil || post != nil {
			t.Fatalf("PV %s: %v %q", c.pv.Name, err, op)
		}
		if got := out.(*unstructured.Unstructured).GetAnnotations()[kube.AnnData]; got != c.mark {
			t.Errorf("PV %s: %s=%q, want %q", c.pv.Name, kube.AnnData, got, c.mark)
		}
	}

	// Progress follows the operator's status.backupNow.
	p, err := a.Progress(op, backup)
	if err != nil || p.Completed || !strings.Contains(p.Description, "waiting for the operator") || p.NTotal != 1<<30 {
		t.Fatalf("before the operator: %+v %v", p, err)
	}
	start := metav1.NewTime(time.Now().Add(-time.Minute).Truncate(time.Second))
	setBackupNow(t, api.Client, "app", "data", backupv1alpha1.BackupNowResult{
		Request: request, Job: "data-now-1", Phase: backupv1alpha1.BackupNowRunning, LogicalBytes: 12345, StartTime: &start})
	p, err = a.Progress(op, backup)
	if err != nil || p.Completed || p.NCompleted != 12345 || p.OperationUnits != "Bytes" || !p.Started.Equal(start.Time) {
		t.Fatalf("running: %+v %v", p, err)
	}

	// Cancel deletes the running Job.
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "data-now-1", Namespace: "app"},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "revault", Image: "x"}}}}}}
	if err := api.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	if err := a.Cancel(op, backup); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the Job's deletion", func() error {
		j := &batchv1.Job{}
		err := api.Client.Get(ctx, client.ObjectKeyFromObject(job), j)
		if apierrors.IsNotFound(err) || (err == nil && j.DeletionTimestamp != nil) {
			return nil
		}
		return os.ErrExist
	})

	time.Sleep(5 * a.Poll)
	select {
	case r := <-returned:
		t.Fatalf("Execute returned while the volume was still being read (%+v): the post hooks would run too early", r)
	default:
	}
	done := metav1.NewTime(time.Now().Truncate(time.Second))
	setBackupNow(t, api.Client, "app", "data", backupv1alpha1.BackupNowResult{
		Request: request, Job: "data-now-1", Phase: backupv1alpha1.BackupNowSucceeded, Version: 7, LogicalBytes: 99999,
		StartTime: &start, CompletionTime: &done})
	p, err = a.Progress(op, backup)
	if err != nil || !p.Completed || p.Err != "" || p.NCompleted != 99999 || p.NTotal != 99999 || !strings.Contains(p.Description, "version 7") {
		t.Fatalf("succeeded: %+v %v", p, err)
	}
	var r testutil.Executed
	select {
	case r = <-returned:
	case <-time.After(30 * time.Second):
		t.Fatal("Execute did not return once the volume was read")
	}
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if r.Op != op {
		t.Fatalf("operation ID %q", r.Op)
	}
	// The series goes into the backup with the PVC, and is updated when the backup finalizes.
	for what, ids := range map[string][]velero.ResourceIdentifier{"additional": r.Extra, "post-operation": r.Post} {
		if len(ids) != 1 || ids[0].Namespace != "app" || ids[0].Name != "data" || ids[0].GroupResource.String() != "backupseries.backup.revault.io" {
			t.Fatalf("%s items: %+v", what, ids)
		}
	}
	ann := r.Item.(*unstructured.Unstructured).GetAnnotations()
	if ann[kube.AnnSeries] != "data" || ann[kube.AnnRequest] != request || ann[kube.AnnMedia] != "hdd" ||
		ann[velerov1.MustIncludeAdditionalItemAnnotation] != "true" {
		t.Fatalf("the backed-up PVC names its series and request: %v", ann)
	}
	// Execute again (Velero retries): the same request, done already, no second series.
	if _, _, op2, _, err := a.Execute(toUnstructured(t, data), backup); err != nil || op2 != op {
		t.Fatalf("idempotent: %v %q", err, op2)
	}

	// Finalizing: the backed-up BackupSeries records the version, the PVC and the worker; the
	// PVC itself is left alone then.
	backup.Status.Phase = velerov1.BackupPhaseFinalizing
	mustGet(t, api.Client, "app", "data", bs)
	bs.TypeMeta = metav1.TypeMeta{APIVersion: "backup.revault.io/v1alpha1", Kind: "BackupSeries"}
	item, _, fop, _, err := a.Execute(toUnstructured(t, bs), backup)
	if err != nil || fop != "" {
		t.Fatalf("finalize: %v %q", err, fop)
	}
	ann = item.(*unstructured.Unstructured).GetAnnotations()
	if ann[kube.AnnVersion] != "7" || ann[kube.AnnPVC] != "data" || ann[kube.AnnRequest] != request ||
		ann[kube.AnnWorker] != "http://worker.example:8420" {
		t.Fatalf("annotations: %v", ann)
	}
	if item, _, fop, _, err := a.Execute(toUnstructured(t, data), backup); err != nil || fop != "" ||
		item.(*unstructured.Unstructured).GetAnnotations()[kube.AnnRequest] != "" {
		t.Fatalf("the PVC when finalizing: %v %q", err, fop)
	}
	// Another Velero backup's request is not this backup's version.
	other := backup.DeepCopy()
	other.Name = "weekly"
	item, _, _, _, _ = a.Execute(toUnstructured(t, bs), other)
	if _, ok := item.(*unstructured.Unstructured).GetAnnotations()[kube.AnnVersion]; ok {
		t.Fatal("a series finalized for another backup records no version")
	}

	// A failed backup reports the operator's message.
	backup.Status.Phase = velerov1.BackupPhaseInProgress
	setBackupNow(t, api.Client, "app", "data", backupv1alpha1.BackupNowResult{
		Request: request, Job: "data-now-2", Phase: backupv1alpha1.BackupNowFailed, Message: "the disk is full"})
	p, err = a.Progress(op, backup)
	if err != nil || !p.Completed || !strings.Contains(p.Err, "the disk is full") {
		t.Fatalf("failed: %+v %v", p, err)
	}
	backup.Status.Phase = velerov1.BackupPhaseFinalizingPartiallyFailed
	mustGet(t, api.Client, "app", "data", bs)
	bs.TypeMeta = metav1.TypeMeta{APIVersion: "backup.revault.io/v1alpha1", Kind: "BackupSeries"}
	item, _, _, _, _ = a.Execute(toUnstructured(t, bs), backup)
	if _, ok := item.(*unstructured.Unstructured).GetAnnotations()[kube.AnnVersion]; ok {
		t.Fatal("a failed request records no version")
	}
	backup.Status.Phase = velerov1.BackupPhaseInProgress

	// A request replaced before the operator saw it fails clearly instead of waiting forever.
	testutil.Eventually(t, "a newer request", func() error {
		cur := &backupv1alpha1.BackupSeries{}
		mustGet(t, api.Client, "app", "data", cur)
		cur.Annotations[backupv1alpha1.BackupNowAnnotation] = "someone-else"
		cur.Status.BackupNow = nil
		cur.Status.LastBackupNow = "someone-else"
		if err := api.Client.Update(ctx, cur); err != nil {
			return err
		}
		mustGet(t, api.Client, "app", "data", cur)
		cur.Status.BackupNow, cur.Status.LastBackupNow = nil, "someone-else"
		return api.Client.Status().Update(ctx, cur)
	})
	p, _ = a.Progress(op, backup)
	if !p.Completed || !strings.Contains(p.Err, "was replaced") {
		t.Fatalf("superseded: %+v", p)
	}
	if _, err := a.Progress("garbage", backup); err == nil {
		t.Fatal("a bad operation ID is an error")
	}
}

func TestBackupActionGivesUpAfterTheItemOperationTimeout(t *testing.T) {
	api := testutil.StartAPI(t)
	api.Namespace(t, "app")
	a := &PVCBackup{Log: logrus.New(), Poll: 50 * time.Millisecond}
	backup := &velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "velero", UID: "0123456789abcdef"}}
	backup.Status.Phase = velerov1.BackupPhaseInProgress
	backup.Spec.ItemOperationTimeout = metav1.Duration{Duration: 300 * time.Millisecond}
	logs := pvc("app", "logs", true)
	// The start bound is the item operation timeout when that is shorter.
	if err := api.Client.Create(context.Background(), logs.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	// No operator runs: the request is never started.
	_, _, op, _, err := a.Execute(toUnstructured(t, logs), backup)
	if err == nil || op != "" {
		t.Fatalf("Execute returned %q, %v", op, err)
	}
	for _, want := range []string{"app/logs/velero-nightly-01234567 was not started within 300ms",
		"before the pod's post hooks run", "waiting for the operator"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// A request that started but does not end is bounded by the item operation timeout.
	start := metav1.Now()
	setBackupNow(t, api.Client, "app", "logs", backupv1alpha1.BackupNowResult{
		Request: "velero-nightly-01234567", Job: "logs-now-1", Phase: backupv1alpha1.BackupNowRunning, StartTime: &start})
	_, _, _, _, err = a.Execute(toUnstructured(t, logs), backup)
	if err == nil || !strings.Contains(err.Error(), "did not finish within 300ms (the backup's itemOperationTimeout)") ||
		!strings.Contains(err.Error(), "Job logs-now-1 is backing up the volume") {
		t.Fatalf("a started request past the timeout: %v", err)
	}
}

func TestRestoreActionRestoresPVCsBeforePodsStart(t *testing.T) {
	api := testutil.StartAPI(t)
	ctx := context.Background()
	api.Namespace(t, "app")
	a := &PVCRestore{Log: logrus.New()}
	restore := &velerov1.Restore{ObjectMeta: metav1.ObjectMeta{Name: "r1", Namespace: "velero"}}
	sel, _ := a.AppliesTo()
	if strings.Join(sel.IncludedResources, ",") != "persistentvolumeclaims,pods,persistentvolumes,backupseries.backup.revault.io" {
		t.Fatalf("AppliesTo: %+v", sel)
	}
	run := func(item, from runtime.Object) (*velero.RestoreItemActionExecuteOutput, error) {
		return a.Execute(&velero.RestoreItemActionExecuteInput{Item: toUnstructured(t, item), ItemFromBackup: toUnstructured(t, from), Restore: restore})
	}
	// What Velero does with an item once the actions are done: create it, labelled.
	create := func(out *velero.RestoreItemActionExecuteOutput) {
		t.Helper()
		u := out.UpdatedItem.(*unstructured.Unstructured).DeepCopy()
		labels := u.GetLabels()
		if labels == nil {
			labels = map[string]string{}
		}
		labels[velerov1.RestoreNameLabel] = restore.Name
		u.SetLabels(labels)
		u.SetResourceVersion("")
		if err := api.Client.Create(ctx, u); err != nil {
			t.Fatal(err)
		}
	}

	// 1. The PV of a Revault-backed claim is not restored; other PVs are.
	for _, c := range []struct {
		mark string
		skip bool
	}{{"app/data", true}, {"", false}} {
		pv := &corev1.PersistentVolume{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolume"},
			ObjectMeta: metav1.ObjectMeta{Name: "pv-old", Annotations: map[string]string{}}}
		if c.mark != "" {
			pv.Annotations[kube.AnnData] = c.mark
		}
		out, err := run(pv, pv)
		if err != nil || out.SkipRestore != c.skip || out.OperationID != "" {
			t.Fatalf("PV marked %q: skip=%v %v, want skip=%v", c.mark, out.SkipRestore, err, c.skip)
		}
	}

	// 2. The PVC gets a new volume; its restore is an operation.
	backedUp := pvc("app", "data", true)
	backedUp.Annotations = map[string]string{kube.AnnSeries: "data", kube.AnnRequest: "velero-nightly-01234567", kube.AnnMedia: "ssd",
		"pv.kubernetes.io/bind-completed": "yes", "volume.kubernetes.io/selected-node": "node-1"}
	out, err := run(backedUp, backedUp)
	if err != nil {
		t.Fatal(err)
	}
	rjName := RestoreJobName("r1", "data")
	if out.OperationID != "app/"+rjName || out.SkipRestore {
		t.Fatalf("output: %+v", out)
	}
	restored := out.UpdatedItem.(*unstructured.Unstructured)
	if _, found, _ := unstructured.NestedString(restored.Object, "spec", "volumeName"); found {
		t.Fatal("the old volume binding is dropped")
	}
	for _, k := range []string{"pv.kubernetes.io/bind-completed", "volume.kubernetes.io/selected-node"} {
		if _, ok := restored.GetAnnotations()[k]; ok {
			t.Fatalf("annotation %s is dropped: %v", k, restored.GetAnnotations())
		}
	}
	create(out)
	// PVCs without Revault data are not ours; namespace mappings are refused.
	plain := pvc("app", "other", false)
	plainOut, err := run(plain, plain)
	if err != nil || plainOut.OperationID != "" {
		t.Fatalf("plain PVC: %+v %v", plainOut, err)
	}
	create(plainOut)
	moved := backedUp.DeepCopy()
	moved.Namespace = "app-copy"
	if _, err := run(moved, backedUp); err == nil || !strings.Contains(err.Error(), "restoring into namespace app-copy is not supported") {
		t.Fatalf("namespace mapping: %v", err)
	}

	// 3. A pod using the PVC is held by a scheduling gate; one without it, or with the plain
	// PVC only, is not.
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "db-0", Namespace: "app"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "db", Image: "postgres"}},
			Volumes: []corev1.Volume{
				{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}},
				{Name: "w", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "other"}}},
			}},
	}
	out, err = run(pod, pod)
	if err != nil {
		t.Fatal(err)
	}
	gated := &corev1.Pod{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(out.UpdatedItem.UnstructuredContent(), gated); err != nil {
		t.Fatal(err)
	}
	if len(gated.Spec.SchedulingGates) != 1 || gated.Spec.SchedulingGates[0].Name != kube.SchedulingGate {
		t.Fatalf("gates: %+v", gated.Spec.SchedulingGates)
	}
	create(out)
	for name, vols := range map[string][]corev1.Volume{"web-0": nil, "cache-0": pod.Spec.Volumes[1:]} {
		free := pod.DeepCopy()
		free.Name, free.Spec.Volumes = name, vols
		out, _ := run(free, free)
		if g, _, _ := unstructured.NestedSlice(out.UpdatedItem.UnstructuredContent(), "spec", "schedulingGates"); len(g) != 0 {
			t.Fatalf("pod %s is not gated: %v", name, g)
		}
	}
	// Velero polls only once every item is restored; a RestoreJob missing then never comes.
	p, err := a.Progress("app/"+rjName, restore)
	if err != nil || !p.Completed || !strings.Contains(p.Err, "include backupseries.backup.revault.io") {
		t.Fatalf("no BackupSeries restored: %+v %v", p, err)
	}

	// 4. The BackupSeries: restored without backup-now and the plugin's annotations; its backed-up
	// copy's version is restored into the PVC by a RestoreJob.
	series := &backupv1alpha1.BackupSeries{
		TypeMeta: metav1.TypeMeta{APIVersion: "backup.revault.io/v1alpha1", Kind: "BackupSeries"},
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "app", Annotations: map[string]string{
			backupv1alpha1.BackupNowAnnotation: "velero-nightly-01234567", kube.AnnRequest: "velero-nightly-01234567",
			kube.AnnVersion: "3", kube.AnnPVC: "data", kube.AnnWorker: "http://w:8420", "team": "db"}},
		Spec: backupv1alpha1.BackupSeriesSpec{Source: backupv1alpha1.BackupSource{PVC: &backupv1alpha1.PVCSource{ClaimName: "data"}}},
	}
	out, err = run(series, series)
	if err != nil || out.OperationID != "" || out.SkipRestore {
		t.Fatalf("BackupSeries: %+v %v", out, err)
	}
	if ann := out.UpdatedItem.(*unstructured.Unstructured).GetAnnotations(); len(ann) != 1 || ann["team"] != "db" {
		t.Fatalf("the restored BackupSeries keeps only its own annotations: %v", ann)
	}
	rj := &backupv1alpha1.RestoreJob{}
	mustGet(t, api.Client, "app", rjName, rj)
	if rj.Spec.SeriesRef.Name != "data" || rj.Spec.Version != "3" || rj.Spec.TargetPVC.ClaimName != "data" ||
		rj.Labels[kube.LabelRestore] != "r1" {
		t.Fatalf("RestoreJob: %+v %v", rj.Spec, rj.Labels)
	}
	// A version for a PVC this restore did not create (it existed, Velero left it alone): no
	// RestoreJob overwrites it.
	existing := pvc("app", "kept", false)
	existing.Spec.VolumeName = ""
	if err := api.Client.Create(ctx, existing); err != nil {
		t.Fatal(err)
	}
	keptSeries := series.DeepCopy()
	keptSeries.Name, keptSeries.Annotations[kube.AnnPVC] = "kept", "kept"
	if _, err := run(keptSeries, keptSeries); err != nil {
		t.Fatal(err)
	}
	if err := api.Client.Get(ctx, types.NamespacedName{Namespace: "app", Name: RestoreJobName("r1", "kept")}, &backupv1alpha1.RestoreJob{}); !apierrors.IsNotFound(err) {
		t.Fatalf("no RestoreJob over an existing PVC: %v", err)
	}

	// 5. Progress follows the RestoreJob and releases the pod once its Revault volume is back.
	setRestore := func(phase backupv1alpha1.RestorePhase, msg string) {
		testutil.Eventually(t, "the RestoreJob status", func() error {
			cur := &backupv1alpha1.RestoreJob{}
			if err := api.Client.Get(ctx, types.NamespacedName{Namespace: "app", Name: rjName}, cur); err != nil {
				return err
			}
			cur.Status.Phase, cur.Status.TotalBytes, cur.Status.RestoredBytes = phase, 1000, 0
			cur.Status.ResolvedVersion = 3
			if phase == backupv1alpha1.RestoreSucceeded {
				cur.Status.RestoredBytes = 1000
			}
			if msg != "" {
				cur.Status.Conditions = []metav1.Condition{{Type: backupv1alpha1.ConditionFailed, Status: metav1.ConditionTrue,
					Reason: "JobFailed", Message: msg, LastTransitionTime: metav1.Now()}}
			}
			return api.Client.Status().Update(ctx, cur)
		})
	}
	setRestore(backupv1alpha1.RestoreRunning, "")
	p, err = a.Progress("app/"+rjName, restore)
	if err != nil || p.Completed || p.NTotal != 1000 {
		t.Fatalf("running: %+v %v", p, err)
	}
	cur := &corev1.Pod{}
	mustGet(t, api.Client, "app", "db-0", cur)
	if len(cur.Spec.SchedulingGates) != 1 {
		t.Fatal("the pod stays gated while the restore runs")
	}
	setRestore(backupv1alpha1.RestoreSucceeded, "")
	p, err = a.Progress("app/"+rjName, restore)
	if err != nil || !p.Completed || p.Err != "" || p.NCompleted != 1000 || !strings.Contains(p.Description, "version 3") {
		t.Fatalf("succeeded: %+v %v", p, err)
	}
	mustGet(t, api.Client, "app", "db-0", cur)
	if len(cur.Spec.SchedulingGates) != 0 {
		t.Fatalf("the pod is released once its volume is back: %+v", cur.Spec.SchedulingGates)
	}
	setRestore(backupv1alpha1.RestoreFailed, "series app/data has no version 3")
	p, _ = a.Progress("app/"+rjName, restore)
	if !p.Completed || !strings.Contains(p.Err, "has no version 3") {
		t.Fatalf("failed: %+v", p)
	}
	if err := a.Cancel("app/"+rjName, restore); err != nil {
		t.Fatal(err)
	}
	if err := api.Client.Get(ctx, types.NamespacedName{Namespace: "app", Name: rjName}, &backupv1alpha1.RestoreJob{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Cancel deletes the RestoreJob: %v", err)
	}
}

func TestOperatorObjectsAreNotRestored(t *testing.T) {
	a := &SkipOperatorObjects{Log: logrus.New()}
	mk := func(kind, name string, labels map[string]string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetKind(kind)
		u.SetName(name)
		u.SetNamespace("app")
		u.SetLabels(labels)
		return u
	}
	ours := map[string]string{"app.kubernetes.io/part-of": "revault"}
	for _, c := range []struct {
		item *unstructured.Unstructured
		skip bool
	}{
		{mk("Job", "data-now-abc", ours), true},
		{mk("Job", "nightly-report", nil), false},
		{mk("CronJob", "data-backup", ours), true},
		{mk("Pod", "data-now-abc-xyz", ours), true},
		{mk("Pod", "db-0", map[string]string{"app": "db"}), false},
		{mk("RestoreJob", "old-restore", nil), true},
		{mk("Secret", kube.TokenSecret, ours), true},
		{mk("Secret", "db-password", nil), false},
	} {
		out, err := a.Execute(&velero.RestoreItemActionExecuteInput{Item: c.item, ItemFromBackup: c.item})
		if err != nil || out.SkipRestore != c.skip {
			t.Errorf("%s %s: skip=%v err=%v, want skip=%v", c.item.GetKind(), c.item.GetName(), out.SkipRestore, err, c.skip)
		}
	}
}

// The worker serves HTTPS with a certificate of its own CA, as the operator's workers do: the
// action trusts it through the namespace's bundle (ConfigMap revault-ca).
func TestDeleteActionExpiresTheBackupsVersions(t *testing.T) {
	api := testutil.StartAPI(t)
	w := testutil.StartTLSWorker(t, "app")
	api.Namespace(t, "app")
	a := &PVCDelete{Log: logrus.New()}
	backup := &velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "nightly", Namespace: "velero"}}

	dir := t.TempDir()
	for i := 1; i <= 3; i++ {
		f := filepath.Join(dir, "v")
		if err := os.WriteFile(f, []byte(strings.Repeat(string(rune('a'+i)), 100000)), 0o644); err != nil {
			t.Fatal(err)
		}
		w.Push(t, "app", "data", f)
	}
	exists := func(v int64) bool {
		for _, have := range w.Versions(t, "app", "data") {
			if have.Number == v {
				return true
			}
		}
		return false
	}
	// The backed-up BackupSeries records the version (the PVC only names its series).
	item := &backupv1alpha1.BackupSeries{
		TypeMeta: metav1.TypeMeta{APIVersion: "backup.revault.io/v1alpha1", Kind: "BackupSeries"},
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "app", Annotations: map[string]string{
			kube.AnnVersion: "2", kube.AnnPVC: "data", kube.AnnWorker: w.URL}},
	}
	sel, _ := a.AppliesTo()
	if strings.Join(sel.IncludedResources, ",") != "backupseries.backup.revault.io,datauploads.velero.io" {
		t.Fatalf("AppliesTo: %+v", sel)
	}

	// No token Secret yet (the namespace lost it): a clear error, nothing expired.
	err := a.Execute(&velero.DeleteItemActionExecuteInput{Item: toUnstructured(t, item), Backup: backup})
	if err == nil || !strings.Contains(err.Error(), "stays on its worker") || !exists(2) {
		t.Fatalf("without a token: %v", err)
	}
	api.TokenSecret(t, "app", w.Tokens["app"])
	// No CA bundle: the worker's certificate is not trusted, nothing expired.
	err = a.Execute(&velero.DeleteItemActionExecuteInput{Item: toUnstructured(t, item), Backup: backup})
	if err == nil || !strings.Contains(err.Error(), "certificate") || !exists(2) {
		t.Fatalf("without the CA bundle: %v", err)
	}
	api.CABundle(t, "app", w.CA)
	if err := a.Execute(&velero.DeleteItemActionExecuteInput{Item: toUnstructured(t, item), Backup: backup}); err != nil {
		t.Fatal(err)
	}
	if exists(2) || !exists(1) || !exists(3) {
		t.Fatal("exactly version 2 is expired")
	}
	// Deleting again (Velero retries) is fine.
	if err := a.Execute(&velero.DeleteItemActionExecuteInput{Item: toUnstructured(t, item), Backup: backup}); err != nil {
		t.Fatal(err)
	}
	// A BackupSeries that recorded no version (backed up for other reasons) is ignored, and a
	// PVC names no version.
	plain := item.DeepCopy()
	plain.Annotations = nil
	if err := a.Execute(&velero.DeleteItemActionExecuteInput{Item: toUnstructured(t, plain), Backup: backup}); err != nil {
		t.Fatal(err)
	}
	named := pvc("app", "data", true)
	named.Annotations = map[string]string{kube.AnnSeries: "data", kube.AnnRequest: "velero-nightly-x"}
	if err := a.Execute(&velero.DeleteItemActionExecuteInput{Item: toUnstructured(t, named), Backup: backup}); err != nil || !exists(1) || !exists(3) {
		t.Fatalf("a PVC item: %v", err)
	}

	// A revault data mover DataUpload: its snapshot ID names the version. Its worker was
	// recorded as http:// before TLS was turned on; the namespace's bundle says the worker now
	// serves HTTPS, and the action goes there.
	du := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "velero.io/v2alpha1", "kind": "DataUpload",
		"metadata": map[string]any{"name": "nightly-x", "namespace": "velero"},
		"spec":     map[string]any{"datamover": "revault"},
		"status": map[string]any{"snapshotID": "app/data@3",
			"dataMoverResult": map[string]any{"worker": "http://" + strings.TrimPrefix(w.URL, "https://")}},
	}}
	if err := a.Execute(&velero.DeleteItemActionExecuteInput{Item: du, Backup: backup}); err != nil {
		t.Fatal(err)
	}
	if exists(3) || !exists(1) {
		t.Fatal("the DataUpload's version is expired")
	}
	// Another data mover's DataUpload is ignored. Its snapshot ID names version 1, which still
	// exists: expiring it by mistake would show.
	kopia := du.DeepCopy()
	_ = unstructured.SetNestedField(kopia.Object, "velero", "spec", "datamover")
	_ = unstructured.SetNestedField(kopia.Object, "app/data@1", "status", "snapshotID")
	if err := a.Execute(&velero.DeleteItemActionExecuteInput{Item: kopia, Backup: backup}); err != nil || !exists(1) {
		t.Fatalf("other data movers' DataUploads are ignored: %v", err)
	}
}
