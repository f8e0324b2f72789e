package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"github.com/vmware-tanzu/velero/pkg/persistence"
	"github.com/vmware-tanzu/velero/pkg/plugin/clientmgmt"
	"github.com/vmware-tanzu/velero/pkg/plugin/clientmgmt/process"
	"github.com/vmware-tanzu/velero/pkg/plugin/framework"
	"github.com/vmware-tanzu/velero/pkg/plugin/framework/common"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/velero-plugin/internal/actions"
	"github.com/revault-io/revault/velero-plugin/internal/kube"
	"github.com/revault-io/revault/velero-plugin/internal/testutil"
)

// Velero's plugin registry runs Velero's own binary (os.Args[0]) with "run-plugins" to list the
// plugins built into Velero. In this test the test binary plays Velero: it serves none.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "run-plugins" {
		framework.NewServer().Serve()
		return
	}
	os.Exit(m.Run())
}

type getter struct{ m clientmgmt.Manager }

func (g getter) GetObjectStore(provider string) (velero.ObjectStore, error) {
	return g.m.GetObjectStore(provider)
}

// TestThroughVelerosPluginManager builds the plugin binary, lets Velero's registry discover it,
// gets every plugin through Velero's client manager (gRPC, hashicorp/go-plugin) and calls them:
// the ObjectStore under Velero's own backup store layer, and the item actions against a real
// API server and worker.
func TestThroughVelerosPluginManager(t *testing.T) {
	api := testutil.StartAPI(t)
	w := testutil.StartWorker(t, "velero", "app")
	ctx := context.Background()
	api.Namespace(t, "velero")
	api.Namespace(t, "app")
	// The plugin process finds the API server through $KUBECONFIG, as outside a cluster.
	t.Setenv("KUBECONFIG", api.Kubeconfig)

	dir := t.TempDir()
	bin := filepath.Join(dir, "velero-plugin-revault")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// Velero passes its own arguments after `velero server` on to plugins: none here.
	args := os.Args
	os.Args = []string{args[0], "server"}
	t.Cleanup(func() { os.Args = args })

	log := logrus.New()
	log.SetOutput(io.Discard)
	reg := process.NewRegistry(dir, log, logrus.InfoLevel)
	if err := reg.DiscoverPlugins(); err != nil {
		t.Fatalf("DiscoverPlugins: %v", err)
	}
	names := func(k common.PluginKind) string {
		var out []string
		for _, id := range reg.List(k) {
			if id.Command == bin {
				out = append(out, id.Name)
			}
		}
		sort.Strings(out)
		return strings.Join(out, ",")
	}
	for k, want := range map[common.PluginKind]string{
		common.PluginKindObjectStore:         "revault.io/object-store",
		common.PluginKindBackupItemActionV2:  "revault.io/pvc-backup",
		common.PluginKindRestoreItemActionV2: "revault.io/pvc-restore,revault.io/skip-operator-objects",
		common.PluginKindDeleteItemAction:    "revault.io/pvc-delete",
	} {
		if got := names(k); got != want {
			t.Errorf("%s plugins: %q, want %q", k, got, want)
		}
	}
	mgr := clientmgmt.NewManager(log, logrus.InfoLevel, reg)
	t.Cleanup(mgr.CleanupClients)

	// ---- ObjectStore, under Velero's backup store ----
	bsl := &velerov1.BackupStorageLocation{
		ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "velero"},
		Spec: velerov1.BackupStorageLocationSpec{
			Provider: "revault.io/object-store",
			StorageType: velerov1.StorageType{ObjectStorage: &velerov1.ObjectStorageLocation{
				Bucket: "default", Prefix: "cluster-a"}},
			Config: map[string]string{"url": w.URL, "namespace": "velero", "tokenFile": w.TokenFile(t, "velero")},
		},
	}
	store, err := persistence.NewObjectBackupStoreGetter(nil).Get(bsl, getter{mgr}, log)
	if err != nil {
		t.Fatalf("backup store: %v", err)
	}
	if err := store.IsValid(); err != nil {
		t.Fatalf("IsValid on an empty bucket: %v", err)
	}
	meta, _ := json.Marshal(&velerov1.Backup{TypeMeta: metav1.TypeMeta{APIVersion: "velero.io/v1", Kind: "Backup"},
		ObjectMeta: metav1.ObjectMeta{Name: "b1", Namespace: "velero"}})
	contents := bytes.Repeat([]byte("resources/pods/namespaces/app/p.json "), 5000)
	if err := store.PutBackup(persistence.BackupInfo{
		Name:               "b1",
		Metadata:           bytes.NewReader(meta),
		Contents:           bytes.NewReader(testutil.Gzip(t, contents)),
		Log:                bytes.NewReader(testutil.Gzip(t, []byte("a log line\n"))),
		VolumeSnapshots:    bytes.NewReader(testutil.Gzip(t, []byte("[]"))),
		BackupResourceList: bytes.NewReader(testutil.Gzip(t, []byte(`{"v1/Pod":["app/p"]}`))),
	}); err != nil {
		t.Fatalf("PutBackup: %v", err)
	}
	if err := store.IsValid(); err != nil {
		t.Fatalf("IsValid: %v", err)
	}
	if names, err := store.ListBackups(); err != nil || strings.Join(names, ",") != "b1" {
		t.Fatalf("ListBackups: %v %v", names, err)
	}
	if ok, err := store.BackupExists("default", "b1"); !ok || err != nil {
		t.Fatalf("BackupExists: %v %v", ok, err)
	}
	if b, err := store.GetBackupMetadata("b1"); err != nil || b.Name != "b1" {
		t.Fatalf("GetBackupMetadata: %v %v", b, err)
	}
	if s, err := store.GetBackupVolumeSnapshots("b1"); err != nil || len(s) != 0 {
		t.Fatalf("GetBackupVolumeSnapshots (gzip JSON): %v %v", s, err)
	}
	rc, err := store.GetBackupContents("b1")
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.Gunzip(t, rc); !bytes.Equal(got, contents) {
		t.Fatal("the contents round-trip")
	}
	_ = rc.Close()
	u, err := store.GetDownloadURL(velerov1.DownloadTarget{Kind: velerov1.DownloadTargetKindBackupLog, Name: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(u)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("signed URL %s: %v %v", u, err, resp)
	}
	if got := testutil.Gunzip(t, resp.Body); string(got) != "a log line\n" {
		t.Fatalf("log via the signed URL: %q", got)
	}
	_ = resp.Body.Close()
	if err := store.DeleteBackup("b1"); err != nil {
		t.Fatalf("DeleteBackup: %v", err)
	}
	if names, _ := store.ListBackups(); len(names) != 0 {
		t.Fatalf("after DeleteBackup: %v", names)
	}

	// ---- BackupItemAction v2 ----
	bia, err := mgr.GetBackupItemActionV2("revault.io/pvc-backup")
	if err != nil {
		t.Fatal(err)
	}
	if sel, err := bia.AppliesTo(); err != nil ||
		strings.Join(sel.IncludedResources, ",") != "persistentvolumeclaims,persistentvolumes,backupseries.backup.revault.io" {
		t.Fatalf("AppliesTo: %+v %v", sel, err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "app", Labels: map[string]string{kube.Select: "true"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if err := api.Client.Create(ctx, pvc.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	m, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(pvc)
	backup := &velerov1.Backup{ObjectMeta: metav1.ObjectMeta{Name: "b2", Namespace: "velero", UID: "aaaabbbbcccc"}}
	backup.Status.Phase = velerov1.BackupPhaseInProgress
	// Execute returns once the volume was read (the operator's Job finished): it runs while this
	// test plays the operator.
	returned := testutil.ExecuteAsync(bia, &unstructured.Unstructured{Object: m}, backup)
	bs := &backupv1alpha1.BackupSeries{}
	testutil.Eventually(t, "the backup request", func() error {
		if err := api.Client.Get(ctx, types.NamespacedName{Namespace: "app", Name: "data"}, bs); err != nil {
			return err
		}
		if bs.Annotations[backupv1alpha1.BackupNowAnnotation] != "velero-b2-aaaabbbb" {
			return fmt.Errorf("backup-now: %v", bs.Annotations)
		}
		return nil
	})
	// Play the operator: the Job made version 1.
	report := w.Push(t, "app", "data", bin)
	var rep struct {
		Version      int64 `json:"version"`
		LogicalBytes int64 `json:"logicalBytes"`
	}
	if err := json.Unmarshal([]byte(report), &rep); err != nil || rep.Version != 1 || rep.LogicalBytes == 0 {
		t.Fatalf("push report %q: %v", report, err)
	}
	bs.Status.Worker = &backupv1alpha1.WorkerPlacement{Media: "ssd", Node: "n1", Endpoint: w.URL}
	bs.Status.BackupNow = []backupv1alpha1.BackupNowResult{{Request: "velero-b2-aaaabbbb", Job: "data-now-x",
		Phase: backupv1alpha1.BackupNowSucceeded, Version: rep.Version, LogicalBytes: rep.LogicalBytes}}
	if err := api.Client.Status().Update(ctx, bs); err != nil {
		t.Fatal(err)
	}
	var r testutil.Executed
	select {
	case r = <-returned:
	case <-time.After(time.Minute):
		t.Fatal("Execute did not return once the backup request succeeded")
	}
	item, extra, op, post := r.Item, r.Extra, r.Op, r.Post
	if r.Err != nil || op != "app/data/velero-b2-aaaabbbb" || len(post) != 1 || len(extra) != 1 || post[0].Name != "data" {
		t.Fatalf("Execute: %q %v %v %v", op, extra, post, r.Err)
	}
	backedUpPVC := item.(*unstructured.Unstructured)
	if backedUpPVC.GetAnnotations()[kube.AnnRequest] != "velero-b2-aaaabbbb" {
		t.Fatalf("the backed-up PVC names the request: %v", backedUpPVC.GetAnnotations())
	}
	p, err := bia.Progress(op, backup)
	if err != nil || !p.Completed || p.Err != "" || p.NCompleted != rep.LogicalBytes {
		t.Fatalf("Progress: %+v %v", p, err)
	}
	// Finalizing: Velero backs the post-operation item (the series) up again.
	backup.Status.Phase = velerov1.BackupPhaseFinalizing
	if err := api.Client.Get(ctx, types.NamespacedName{Namespace: "app", Name: "data"}, bs); err != nil {
		t.Fatal(err)
	}
	bs.TypeMeta = metav1.TypeMeta{APIVersion: "backup.revault.io/v1alpha1", Kind: "BackupSeries"}
	sm, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(bs)
	item, _, _, _, err = bia.Execute(&unstructured.Unstructured{Object: sm}, backup)
	if err != nil {
		t.Fatal(err)
	}
	backedUpSeries := item.(*unstructured.Unstructured)
	if backedUpSeries.GetAnnotations()[kube.AnnVersion] != "1" {
		t.Fatalf("the backed-up series records version 1: %v", backedUpSeries.GetAnnotations())
	}

	// ---- RestoreItemAction v2 ----
	ria, err := mgr.GetRestoreItemActionV2("revault.io/pvc-restore")
	if err != nil {
		t.Fatal(err)
	}
	restore := &velerov1.Restore{ObjectMeta: metav1.ObjectMeta{Name: "r1", Namespace: "velero"}}
	// The namespace was lost: Velero recreates the PVC (labelled with the restore) first.
	if err := api.Client.Delete(ctx, pvc.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the PVC's deletion", func() error {
		cur := &corev1.PersistentVolumeClaim{}
		err := api.Client.Get(ctx, types.NamespacedName{Namespace: "app", Name: "data"}, cur)
		if err == nil && len(cur.Finalizers) > 0 {
			cur.Finalizers = nil
			_ = api.Client.Update(ctx, cur)
		}
		if err == nil {
			return os.ErrExist
		}
		return client.IgnoreNotFound(err)
	})
	out, err := ria.Execute(&velero.RestoreItemActionExecuteInput{Item: backedUpPVC.DeepCopy(), ItemFromBackup: backedUpPVC, Restore: restore})
	if err != nil || out.OperationID != "app/"+actions.RestoreJobName("r1", "data") {
		t.Fatalf("restore Execute (PVC): %+v %v", out, err)
	}
	restoredPVC := out.UpdatedItem.(*unstructured.Unstructured).DeepCopy()
	restoredPVC.SetLabels(map[string]string{velerov1.RestoreNameLabel: "r1"})
	restoredPVC.SetResourceVersion("")
	restoredPVC.SetUID("")
	if err := api.Client.Create(ctx, restoredPVC); err != nil {
		t.Fatal(err)
	}
	if out, err := ria.Execute(&velero.RestoreItemActionExecuteInput{Item: backedUpSeries.DeepCopy(), ItemFromBackup: backedUpSeries, Restore: restore}); err != nil ||
		out.UpdatedItem.(*unstructured.Unstructured).GetAnnotations()[backupv1alpha1.BackupNowAnnotation] != "" {
		t.Fatalf("restore Execute (BackupSeries): %+v %v", out, err)
	}
	rj := &backupv1alpha1.RestoreJob{}
	if err := api.Client.Get(ctx, types.NamespacedName{Namespace: "app", Name: strings.TrimPrefix(out.OperationID, "app/")}, rj); err != nil {
		t.Fatalf("the RestoreJob: %v", err)
	}
	if rj.Spec.Version != "1" || rj.Spec.TargetPVC.ClaimName != "data" {
		t.Fatalf("RestoreJob spec: %+v", rj.Spec)
	}
	if p, err := ria.Progress(out.OperationID, restore); err != nil || p.Completed {
		t.Fatalf("restore Progress: %+v %v", p, err)
	}
	skip, err := mgr.GetRestoreItemActionV2("revault.io/skip-operator-objects")
	if err != nil {
		t.Fatal(err)
	}
	old := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "backup.revault.io/v1alpha1", "kind": "RestoreJob",
		"metadata": map[string]any{"name": "old", "namespace": "app"}}}
	if out, err := skip.Execute(&velero.RestoreItemActionExecuteInput{Item: old, ItemFromBackup: old, Restore: restore}); err != nil || !out.SkipRestore {
		t.Fatalf("an old RestoreJob is not restored: %+v %v", out, err)
	}

	// ---- DeleteItemAction ----
	dia, err := mgr.GetDeleteItemAction("revault.io/pvc-delete")
	if err != nil {
		t.Fatal(err)
	}
	api.TokenSecret(t, "app", w.Tokens["app"])
	if err := dia.Execute(&velero.DeleteItemActionExecuteInput{Item: backedUpSeries, Backup: backup}); err != nil {
		t.Fatalf("delete Execute: %v", err)
	}
	if vs := w.Versions(t, "app", "data"); len(vs) != 0 {
		t.Fatalf("version 1 is expired: %+v", vs)
	}
}
