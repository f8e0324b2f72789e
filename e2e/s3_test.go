package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The workers' remote in the cluster: versitygw (the Versity S3 Gateway, built from the Go
// module proxy by hack/s3-server.sh) on the control-plane node, its objects in a hostPath
// directory so that scaling it to zero and back (the outage scenario) keeps them.
const (
	s3NS        = "revault-s3"
	s3Name      = "s3"
	s3Endpoint  = "http://s3.revault-s3.svc:7070"
	s3Secret    = "revault-s3"
	keySecret   = "revault-remote-key"
	s3AccessKey = "revault-e2e"
	s3SecretKey = "revault-e2e-secret-key"
)

// deployS3 runs the S3 server and writes the Secrets the chart's remote values name (the
// credentials, and a new key file: each run its own).
func deployS3() {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s3NS,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "privileged"}}}
	if err := k.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	labels := map[string]string{"app": s3Name}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: s3Name, Namespace: s3NS},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"node-role.kubernetes.io/control-plane": ""},
					Tolerations: []corev1.Toleration{{Key: "node-role.kubernetes.io/control-plane",
						Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
					Containers: []corev1.Container{{
						Name: "versitygw", Image: s3Image, ImagePullPolicy: corev1.PullNever,
						Args:  []string{"--access", s3AccessKey, "--secret", s3SecretKey, "--port", ":7070", "posix", "/data"},
						Ports: []corev1.ContainerPort{{Name: "s3", ContainerPort: 7070}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
							TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(7070)}}, PeriodSeconds: 2},
						VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
					}},
					Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
						Path: "/var/lib/revault-e2e-s3", Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}}},
				},
			},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: s3Name, Namespace: s3NS},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "s3", Port: 7070, TargetPort: intstr.FromInt32(7070)}}},
	}
	for _, o := range []client.Object{dep, svc} {
		if err := k.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			Expect(err).NotTo(HaveOccurred())
		}
	}
	waitS3Replicas(1)
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	for name, data := range map[string]map[string]string{
		s3Secret:  {"AWS_ACCESS_KEY_ID": s3AccessKey, "AWS_SECRET_ACCESS_KEY": s3SecretKey},
		keySecret: {"key": hex.EncodeToString(key)},
	} {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: systemNS}, StringData: data}
		if err := k.Create(ctx, sec); apierrors.IsAlreadyExists(err) {
			// A kept cluster's earlier run: its stores are encrypted under its key; keep it.
			continue
		} else {
			Expect(err).NotTo(HaveOccurred())
		}
	}
}

// scaleS3 sets the S3 server's replicas (0: the bucket is away) and waits for it.
func scaleS3(n int32) {
	dep := &appsv1.Deployment{}
	Expect(k.Get(ctx, client.ObjectKey{Namespace: s3NS, Name: s3Name}, dep)).To(Succeed())
	patch := client.MergeFrom(dep.DeepCopy())
	dep.Spec.Replicas = ptr.To(n)
	Expect(k.Patch(ctx, dep, patch)).To(Succeed())
	waitS3Replicas(n)
}

func waitS3Replicas(n int32) {
	Eventually(func(g Gomega) {
		var pods corev1.PodList
		g.Expect(k.List(ctx, &pods, client.InNamespace(s3NS), client.MatchingLabels{"app": s3Name})).To(Succeed())
		ready := int32(0)
		for i := range pods.Items {
			if podReady(&pods.Items[i]) && pods.Items[i].DeletionTimestamp == nil {
				ready++
			}
		}
		g.Expect(ready).To(Equal(n))
		if n == 0 {
			g.Expect(pods.Items).To(BeEmpty())
		}
	}).WithTimeout(podTimeout).WithPolling(time.Second).Should(Succeed())
}
