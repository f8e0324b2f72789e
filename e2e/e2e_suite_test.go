// Package e2e is Revault's end-to-end suite: the Helm chart installed on a real multi-node kind
// cluster, real worker pods on labelled nodes, backup and restore Jobs moving real data between
// local volumes, checked from inside the cluster. hack/e2e.sh (make e2e) builds the images,
// brings the cluster up, runs this suite and tears the cluster down; see docs/e2e.md.
//
// Environment (hack/e2e.sh sets all of it):
//
//	KUBECONFIG               the cluster (hack/kind-up.sh)
//	E2E_WORKER_IMAGE         worker image (revault), loaded into the nodes
//	E2E_OPERATOR_IMAGE       operator image, loaded into the nodes
//	E2E_TOOL_IMAGE           e2e/cmd/e2e-tool image, loaded into the nodes
//	E2E_S3_IMAGE             the S3 server's image (versitygw), loaded into the nodes
//	E2E_SPARE_NODE           the unlabelled worker node the failover scenario loses
//	E2E_CHART                charts/revault (default ../charts/revault)
//	E2E_HELM                 helm binary (default helm on PATH)
//	E2E_RUN_ID               suffix of the test namespaces (default: from the clock)
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
)

const (
	systemNS    = "revault-system"
	releaseName = "revault"
	operatorDep = "revault-operator" // <release>-operator; the release name contains "revault"
	// Labels of the nodes kind-up.sh labels; the test workloads' namespaces carry e2eLabel.
	storageLabel = backupv1alpha1.StorageLabel
	e2eLabel     = "revault.io/e2e-run"
)

var (
	ctx = context.Background()
	// k is a controller-runtime client with the Revault types, cs a clientset (logs, proxy).
	k  client.Client
	cs *kubernetes.Clientset

	workerImage, operatorImage, toolImage, s3Image string
	runID                                          string
	// anyFailed keeps the test namespaces of a failed run for the post-mortem (hack/e2e.sh
	// prints their events; KEEP=1 keeps the cluster).
	anyFailed atomic.Bool
)

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Revault e2e on kind")
}

func mustEnv(name string) string {
	v := os.Getenv(name)
	if v == "" {
		Fail(fmt.Sprintf("%s is not set: run the suite with hack/e2e.sh (make e2e)", name))
	}
	return v
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

var _ = BeforeSuite(func() {
	workerImage = mustEnv("E2E_WORKER_IMAGE")
	operatorImage = mustEnv("E2E_OPERATOR_IMAGE")
	toolImage = mustEnv("E2E_TOOL_IMAGE")
	s3Image = mustEnv("E2E_S3_IMAGE")
	runID = envOr("E2E_RUN_ID", time.Now().UTC().Format("0102-150405"))
	cfg, err := clientcmd.BuildConfigFromFlags("", mustEnv("KUBECONFIG"))
	Expect(err).NotTo(HaveOccurred())
	cfg.QPS, cfg.Burst = 50, 100
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(backupv1alpha1.AddToScheme(scheme)).To(Succeed())
	k, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	cs, err = kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())

	By("the cluster has one worker node labelled ssd and one labelled hdd")
	for _, media := range []string{"ssd", "hdd"} {
		var nodes corev1.NodeList
		Expect(k.List(ctx, &nodes, client.MatchingLabels{storageLabel: media})).To(Succeed())
		Expect(nodes.Items).To(HaveLen(1), "nodes labelled %s=%s", storageLabel, media)
	}

	// Workers run as root on hostPath volumes: the namespace needs the privileged PSA level.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNS,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}}}
	if err := k.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	By("an S3 server in the cluster, and the remote's Secrets")
	deployS3()
	chart, wImage, oImage := envOr("E2E_CHART", "../charts/revault"), workerImage, operatorImage
	if upgradeGroup() {
		// Scenario 16 upgrades from the previous release: this group starts with it.
		chart, wImage, oImage = mustEnv("E2E_PREVIOUS_CHART"), mustEnv("E2E_PREVIOUS_WORKER_IMAGE"), mustEnv("E2E_PREVIOUS_OPERATOR_IMAGE")
	}
	By("helm upgrade --install " + releaseName + " " + chart + " (images " + wImage + ", " + oImage + ")")
	out, err := installRelease(chart, wImage, oImage)
	Expect(err).NotTo(HaveOccurred(), "helm: %s", out)

	// A failed run keeps its namespaces for the post-mortem (KEEP=1 keeps the cluster too);
	// their PVCs hold local PVs that this run needs. The next run is past the post-mortem.
	var old corev1.NamespaceList
	Expect(k.List(ctx, &old, client.HasLabels{e2eLabel})).To(Succeed())
	for i := range old.Items {
		if n := &old.Items[i]; n.Labels[e2eLabel] != runID && n.DeletionTimestamp == nil {
			By("deleting namespace " + n.Name + " of an earlier run")
			Expect(client.IgnoreNotFound(k.Delete(ctx, n))).To(Succeed())
		}
	}
})

// upgradeGroup says whether this run is the e2e group "upgrade" (hack/e2e.sh runs it first, on a
// new cluster): it installs the previous release, which scenario 16 upgrades.
func upgradeGroup() bool { return os.Getenv("E2E_GROUP") == "upgrade" }

// installRelease runs `helm upgrade --install` of chart with the suite's values and these
// images. Every group and scenario 16's upgrade use it, so a release differs from the one before
// only in its chart and images.
func installRelease(chart, wImage, oImage string) (string, error) {
	repo := func(ref string) string { return ref[:strings.LastIndex(ref, ":")] }
	tag := func(ref string) string { return ref[strings.LastIndex(ref, ":")+1:] }
	return helm("upgrade", "--install", releaseName, chart,
		"--namespace", systemNS, "--wait", "--timeout", "5m",
		"--set", "operator.image.repository="+repo(oImage),
		"--set", "operator.image.tag="+tag(oImage),
		// Loaded with `kind load image-archive`: never pulled.
		"--set", "operator.image.pullPolicy=Never",
		"--set", "worker.image.repository="+repo(wImage),
		"--set", "worker.image.tag="+tag(wImage),
		"--set", "worker.image.pullPolicy=Never",
		// Status is read back from the workers every syncPeriod (and on every backup Job
		// change); a short period makes retention results visible sooner.
		"--set", "operator.syncPeriod=10s",
		// The kind nodes' disks are the CI host's, whose free room other tenants move (it was
		// 9% once): the nearly-full check is the envtest suite's to prove, not this one's.
		"--set", "operator.minFreePercent=0",
		// Job pods request less CPU than the default 100m (they have no CPU limit, so they run
		// as fast as before): scenario 7 caps them at 25m to make a backup stream last long
		// enough to kill its worker in the middle, and a limit cannot be below the request.
		"--set", "jobs.resources.requests.cpu=25m",
		// Every store keeps its copy in the in-cluster S3 server; short times so the
		// failover and outage scenarios (remote_test.go) do not wait for production's.
		"--set", "remote.enabled=true",
		"--set", "remote.url=s3://revault-e2e/kind",
		"--set", "remote.endpoint="+s3Endpoint,
		"--set", "remote.credentialsSecret="+s3Secret,
		"--set", "remote.keySecret="+keySecret,
		"--set", "remote.syncInterval=2s",
		"--set", "remote.lostNodeTimeout=20s",
		"--set", "remote.behindAfter=20s",
		// The spare node (kind-up.sh) is tainted so that only workers run there: scenario 12
		// stops it, and CoreDNS, the operator or the S3 server stopped with it would fail
		// what follows for reasons of their own. Both pools tolerate the taint (12 labels the
		// spare ssd, 14 hdd).
		"--set-json", `worker.pools=[`+
			`{"media":"ssd","resources":{"requests":{"cpu":"250m","memory":"512Mi"},"limits":{"memory":"2Gi"}},`+
			`"tolerations":[{"key":"revault.io/spare","operator":"Exists","effect":"NoExecute"}]},`+
			`{"media":"hdd","resources":{"requests":{"cpu":"250m","memory":"512Mi"},"limits":{"memory":"2Gi"}},`+
			`"tolerations":[{"key":"revault.io/spare","operator":"Exists","effect":"NoExecute"}]}]`)
}

var _ = ReportAfterEach(func(r SpecReport) {
	if r.Failed() {
		anyFailed.Store(true)
	}
})

func helm(args ...string) (string, error) {
	cmd := exec.Command(envOr("E2E_HELM", "helm"), args...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
