package controller

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	velerov2alpha1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v2alpha1"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/config"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/internal/tokens"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// The suite runs the operator's controllers in-process against a real kube-apiserver and etcd
// (envtest, binaries from hack/k8s-binaries.sh) and real `revault serve` workers on loopback.
// Envtest has no kubelet, scheduler or controller-manager: the tests play the DaemonSet
// controller (worker pods bound to fake nodes and marked Ready), the kubelet (copying the worker
// token Secret to the file the workers read, writing Job pods' termination messages) and the
// Job controller (Job status), and run the real `revault push` / `pull` themselves.

const operatorNS = "revault-system"

var (
	ctx       context.Context
	cancel    context.CancelFunc
	testEnv   *envtest.Environment
	restCfg   *rest.Config
	k8sClient client.Client
	scheme    = runtime.NewScheme()
	opConfig  *config.Config
	clock     = &testClock{}
	repoRoot  string
	revault   string
	scratch   string

	// Three workers on three fake nodes: two SSD, one HDD.
	workerNodes = []struct {
		node  string
		media backupv1alpha1.Media
	}{{"node-ssd-1", backupv1alpha1.MediaSSD}, {"node-ssd-2", backupv1alpha1.MediaSSD}, {"node-hdd-1", backupv1alpha1.MediaHDD}}
	workerURL = map[string]string{}

	// The workers' remote: a versitygw on loopback (hack/s3-server.sh).
	s3Addr        string
	remoteKeyFile string
	s3Proc        *exec.Cmd
)

// lostNode is a fourth SSD node that the failover test loses (failover_test.go).
const lostNode = "node-ssd-9"

// testClock is the operator's clock in tests: real time plus an offset the tests move forward.
type testClock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controller Suite")
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	SetDefaultEventuallyTimeout(10 * time.Second)
	SetDefaultEventuallyPollingInterval(100 * time.Millisecond)
	ctx, cancel = context.WithCancel(context.TODO())

	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS must name the dir with kube-apiserver, etcd and kubectl: run `make test-operator`, "+
			"or export KUBEBUILDER_ASSETS=$(hack/k8s-binaries.sh envtest | tail -1)")
	revault = os.Getenv("REVAULT_BIN")
	Expect(revault).NotTo(BeEmpty(), "REVAULT_BIN must name the revault binary (make build)")

	wd, err := os.Getwd()
	Expect(err).NotTo(HaveOccurred())
	repoRoot = filepath.Join(wd, "..", "..", "..")
	scratch = GinkgoT().TempDir()
	workerTokenFile = filepath.Join(scratch, "tokens")

	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(backupv1alpha1.AddToScheme(scheme)).To(Succeed())
	Expect(velerov1.AddToScheme(scheme)).To(Succeed())
	Expect(velerov2alpha1.AddToScheme(scheme)).To(Succeed())
	Expect(snapshotv1.AddToScheme(scheme)).To(Succeed())
	testEnv = &envtest.Environment{
		// Velero's DataUpload/DataDownload CRDs come from the Velero module itself, and the
		// VolumeSnapshot CRDs from the external-snapshotter client module.
		CRDDirectoryPaths:     append([]string{filepath.Join(repoRoot, "config", "crd", "bases"), veleroCRDs(), veleroRestoreCRD()}, snapshotCRDs()...),
		ErrorIfCRDPathMissing: true,
	}
	restCfg, err = testEnv.Start()
	Expect(err).NotTo(HaveOccurred())
	k8sClient, err = client.New(restCfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: operatorNS}})).To(Succeed())

	startS3()
	opConfig, err = config.Parse([]byte(`
namespace: ` + operatorNS + `
worker:
  image: revault.local/revault:test
  hostPath: /var/lib/revault
pools:
  - media: ssd
  - media: hdd
remote:
  url: s3://revault-envtest
  endpoint: http://` + s3Addr + `
  credentialsSecret: revault-s3
  keySecret: revault-remote-key
  lostNodeTimeout: 3s
`))
	Expect(err).NotTo(HaveOccurred())
	for _, w := range workerNodes {
		workerURL[w.node] = fmt.Sprintf("http://127.0.0.1:%d", freePort())
	}
	workerURL[lostNode] = fmt.Sprintf("http://127.0.0.1:%d", freePort())
	// A node whose worker is gone for good: nothing listens there.
	workerURL["node-gone"] = fmt.Sprintf("http://127.0.0.1:%d", freePort())
	// A node whose worker hangs: it accepts connections and never answers.
	workerURL[hungNode] = startHungWorker()

	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  CacheOptions(operatorNS),
		// As many as the operator's default, so the specs run reconciles side by side.
		Controller: ctrlconfig.Controller{MaxConcurrentReconciles: 4},
	})
	Expect(err).NotTo(HaveOccurred())
	Expect(SetupWithManager(mgr, Options{
		Config:          opConfig,
		WorkerOverrides: workerURL,
		SyncPeriod:      time.Second,
		SeriesWait:      3 * time.Second,
		Now:             clock.Now,
		VeleroDataMover: true,
		CallLimits:      testCallLimits,
	})).To(Succeed())
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()

})

// veleroCRDs is the directory of the DataUpload/DataDownload CRDs in the Velero module the
// operator is built with.
func veleroCRDs() string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/vmware-tanzu/velero").Output()
	Expect(err).NotTo(HaveOccurred(), "locating the Velero module")
	return filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "v2alpha1", "bases")
}

// veleroRestoreCRD is the file of Velero's Restore CRD (a mapped DataDownload's owner).
func veleroRestoreCRD() string {
	return filepath.Join(filepath.Dir(filepath.Dir(veleroCRDs())), "v1", "bases", "velero.io_restores.yaml")
}

// snapshotCRDs are the VolumeSnapshot CRD files of the external-snapshotter client module the
// operator is built with.
func snapshotCRDs() []string {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/kubernetes-csi/external-snapshotter/client/v8").Output()
	Expect(err).NotTo(HaveOccurred(), "locating the external-snapshotter client module")
	var files []string
	for _, kind := range []string{"volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"} {
		files = append(files, filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "snapshot.storage.k8s.io_"+kind+".yaml"))
	}
	return files
}

var (
	workersOnce  sync.Once
	workersReady bool
)

// requireWorkers starts the loopback workers and their fake pods the first time a test needs
// them (the CRD validation tests do not).
func requireWorkers() {
	workersOnce.Do(func() {
		out, err := exec.Command(revault, "serve", "--help").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "%s serve --help: %s", revault, out)
		// The operator creates the worker token file Secret; play the kubelet and keep a file
		// in sync with it, then start the workers reading that file.
		tokenFile := workerTokenFile
		Eventually(func() error { return syncTokenFile(tokenFile) }).WithTimeout(30 * time.Second).Should(Succeed())
		go func() {
			defer GinkgoRecover()
			for ctx.Err() == nil {
				if err := syncTokenFile(tokenFile); err != nil && ctx.Err() == nil {
					GinkgoWriter.Printf("token file sync: %v\n", err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
		for _, w := range workerNodes {
			startWorker(w.node, tokenFile)
			makeWorkerPod(w.node, w.media)
		}
		workersReady = true
	})
	Expect(workersReady).To(BeTrue(), "the loopback workers failed to start (see the first failing test)")
}

var _ = AfterSuite(func() {
	if cancel != nil {
		cancel()
	}
	for _, p := range workerProcs {
		_ = p.Process.Signal(os.Interrupt)
	}
	for _, p := range workerProcs {
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = p.Process.Kill()
		}
	}
	if s3Proc != nil {
		_ = s3Proc.Process.Kill()
		_ = s3Proc.Wait()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

var workerProcs []*exec.Cmd

// workerTokenFile is the workers' token file, kept in sync with its Secret.
var workerTokenFile string

// syncTokenFile copies the worker token Secret to path when it changed (atomically, as the
// kubelet updates Secret volumes).
func syncTokenFile(path string) error {
	sec := &corev1.Secret{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: operatorNS, Name: plan.WorkerTokensSecret}, sec); err != nil {
		return err
	}
	data := sec.Data[plan.WorkerTokensKey]
	if old, err := os.ReadFile(path); err == nil && string(old) == string(data) {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// startS3 starts the workers' S3 server (versitygw) on loopback and writes the remote's key
// file, as the chart's key Secret would hold it.
func startS3() {
	bin := os.Getenv("REVAULT_S3_SERVER")
	Expect(bin).NotTo(BeEmpty(), "REVAULT_S3_SERVER must name versitygw: run make test-operator (hack/s3-server.sh install)")
	dir := filepath.Join(scratch, "s3")
	Expect(os.MkdirAll(filepath.Join(dir, "root"), 0o755)).To(Succeed())
	Expect(os.MkdirAll(filepath.Join(dir, "versions"), 0o755)).To(Succeed())
	s3Addr = fmt.Sprintf("127.0.0.1:%d", freePort())
	logf, err := os.Create(filepath.Join(scratch, "s3.log"))
	Expect(err).NotTo(HaveOccurred())
	s3Proc = exec.Command(bin, "--access", "revault-test", "--secret", "revault-test-secret", "--port", s3Addr,
		"posix", "--versioning-dir", filepath.Join(dir, "versions"), filepath.Join(dir, "root"))
	s3Proc.Stdout, s3Proc.Stderr = logf, logf
	Expect(s3Proc.Start()).To(Succeed())
	Eventually(func() error {
		c, err := net.Dial("tcp", s3Addr)
		if err == nil {
			_ = c.Close()
		}
		return err
	}).WithTimeout(20 * time.Second).Should(Succeed())
	remoteKeyFile = filepath.Join(scratch, "remote-key")
	Expect(os.WriteFile(remoteKeyFile, []byte("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n"), 0o600)).To(Succeed())
}

// remoteWorkerArgs are what the pool's pods get from the operator's remote config (the
// DaemonSet's env and flags), for a worker serving node's store of media from host (an adopted
// store's pod: another node, and --adopt).
func remoteWorkerArgs(media backupv1alpha1.Media, node, host string) ([]string, []string) {
	args := []string{"--remote", opConfig.Remote.StoreURL(string(media), node), "--key-file", remoteKeyFile,
		"--sync-interval", "200ms", "--recover"}
	if host != node {
		args = append(args, "--adopt")
	}
	return args, []string{"AWS_ACCESS_KEY_ID=revault-test", "AWS_SECRET_ACCESS_KEY=revault-test-secret",
		"AWS_ENDPOINT_URL=http://" + s3Addr, "AWS_REGION=us-east-1", "AWS_EC2_METADATA_DISABLED=true",
		"NODE_NAME=" + host}
}

func startWorker(node, tokenFile string) *exec.Cmd {
	media := backupv1alpha1.MediaSSD
	for _, w := range workerNodes {
		if w.node == node {
			media = w.media
		}
	}
	return startWorkerAt(node, node, media, filepath.Join(scratch, "store-"+node), tokenFile)
}

// startWorkerAt runs the worker serving node's store (of media) from host, kept in dir.
func startWorkerAt(node, host string, media backupv1alpha1.Media, store, tokenFile string) *exec.Cmd {
	logf, err := os.Create(store + ".log")
	Expect(err).NotTo(HaveOccurred())
	addr := workerURL[node][len("http://"):]
	remoteArgs, remoteEnv := remoteWorkerArgs(media, node, host)
	cmd := exec.Command(revault, append([]string{"serve", "--store", store, "--init", "--listen", addr,
		"--token-file", tokenFile, "--token-reload", "200ms", "--maintenance-interval", "0",
		// One backup at a time, so a spec can hold the slot and see a series queued.
		"--max-backups", "1"}, remoteArgs...)...)
	cmd.Env = append(os.Environ(), remoteEnv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	Expect(cmd.Start()).To(Succeed())
	workerProcs = append(workerProcs, cmd)
	Eventually(func() error {
		return workerclient.Done(workerClient(node, "").GetReadyWithResponse(ctx, nil))
	}).WithTimeout(30*time.Second).Should(Succeed(), "worker on %s did not become ready (log: %s)", node, logf.Name())
	return cmd
}

// workerPodName is the name of the fake worker pod makeWorkerPod makes for node.
func workerPodName(node string, media backupv1alpha1.Media) string {
	return plan.DaemonSetName(string(media)) + "-" + node
}

// makeWorkerPod plays the DaemonSet controller and the kubelet: a worker pod bound to node,
// running and ready.
func makeWorkerPod(node string, media backupv1alpha1.Media) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      workerPodName(node, media),
			Namespace: operatorNS,
			Labels:    plan.WorkerLabels(string(media)),
		},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "revault", Image: opConfig.Worker.Image}},
		},
	}
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	setPodReady(pod, true)
}

func setPodReady(pod *corev1.Pod, ready bool) {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	Eventually(func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return err
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
		return k8sClient.Status().Update(ctx, pod)
	}).Should(Succeed())
}

// workerTokens reads the entries of the workers' token file Secret the operator keeps.
func workerTokens() []tokens.Entry {
	sec := &corev1.Secret{}
	Expect(k8sClient.Get(ctx, types.NamespacedName{Namespace: operatorNS, Name: plan.WorkerTokensSecret}, sec)).To(Succeed())
	es, err := tokens.Parse(string(sec.Data[plan.WorkerTokensKey]))
	Expect(err).NotTo(HaveOccurred())
	return es
}

// adminToken is the operator's own worker token, from that Secret.
func adminToken() string {
	tok, ok := tokens.Lookup(workerTokens(), tokens.AdminScope)
	Expect(ok).To(BeTrue(), "no admin token in the workers' token file")
	return tok
}

// workerClient talks to node's worker with token (none when empty).
func workerClient(node, token string) *workerclient.ClientWithResponses {
	c, err := workerclient.New(workerURL[node], token, nil)
	Expect(err).NotTo(HaveOccurred())
	return c
}

// adminClient talks to a worker with the operator's token, through the calls the operator makes.
func adminClient(node string) *instrumented {
	return &instrumented{c: workerClient(node, adminToken()),
		at: endpoint{url: workerURL[node], limits: DefaultCallLimits, health: NewWorkerHealth()}}
}

var nsCounter int

// newNamespace creates a fresh namespace for one test.
func newNamespace(prefix string) string {
	nsCounter++
	name := fmt.Sprintf("%s-%d", prefix, nsCounter)
	Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	return name
}
