// Package objectstore is Velero's ObjectStore plugin `revault.io/object-store`: a backup storage
// location whose objects live in a Revault worker's object namespace, deduplicated like every
// backup, instead of S3 or MinIO.
//
// The BSL's bucket is a bucket of the Velero namespace on the worker (the series
// VELERO_NAMESPACE/BUCKET). With the operator, create a BackupSeries named like the bucket in
// Velero's namespace with an external source: the operator places it on a worker and issues the
// namespace's token (Secret revault-token), and the plugin finds the worker in its status.
// Without the operator, give the worker's URL in the BSL config.
//
// Velero's tarballs and logs are gzip files: objects whose key ends in .gz and whose body starts
// with the gzip magic are sent with encoding=gzip, so the worker stores (and deduplicates) their
// content and serves them compressed again.
package objectstore

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"k8s.io/apimachinery/pkg/types"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/velero-plugin/internal/kube"
	"github.com/revault-io/revault/velero-plugin/internal/worker"
)

// Config keys of the BSL (spec.config); credentialsFile is set by Velero from spec.credential.
const (
	KeyURL                = "url"
	KeyNamespace          = "namespace"
	KeyTokenFile          = "tokenFile"
	KeyTokenSecret        = "tokenSecret"
	KeyPublicURL          = "publicUrl"
	KeyCACert             = "caCertFile"
	KeyInsecureSkipVerify = "insecureSkipTLSVerify"
	keyCredentialsFile    = "credentialsFile"
	// Keys Velero adds to every object store's config.
	keyBucket = "bucket"
	keyPrefix = "prefix"
	keyCACert = "caCert"
)

const (
	// opTimeout bounds metadata calls to the worker (listings, lookups); bodies stream without a
	// limit.
	opTimeout = 2 * time.Minute
	// kubeTimeout bounds each read from the Kubernetes API (token Secret, BackupSeries).
	kubeTimeout = 30 * time.Second
)

// ObjectStore implements velero.ObjectStore.
type ObjectStore struct {
	log       logrus.FieldLogger
	ns        string
	url       string
	publicURL string
	token     string
	tls       worker.TLSOptions
	mu        sync.Mutex
	clients   map[string]*worker.Client
}

// New returns an uninitialised ObjectStore (Velero calls Init).
func New(log logrus.FieldLogger) *ObjectStore {
	return &ObjectStore{log: log, clients: map[string]*worker.Client{}}
}

// Init reads the BSL config.
func (o *ObjectStore) Init(config map[string]string) error {
	known := map[string]bool{KeyURL: true, KeyNamespace: true, KeyTokenFile: true, KeyTokenSecret: true, KeyPublicURL: true,
		KeyCACert: true, KeyInsecureSkipVerify: true, keyCredentialsFile: true, keyBucket: true, keyPrefix: true, keyCACert: true}
	var unknown []string
	for k := range config {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		return fmt.Errorf("revault.io/object-store: unknown config keys %v (known: url, namespace, tokenFile, tokenSecret, publicUrl, caCertFile, insecureSkipTLSVerify)", unknown)
	}
	o.url = strings.TrimRight(config[KeyURL], "/")
	o.publicURL = strings.TrimRight(config[KeyPublicURL], "/")
	o.ns = config[KeyNamespace]
	if o.ns == "" {
		o.ns = kube.Namespace()
	}
	if v := config[KeyInsecureSkipVerify]; v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("revault.io/object-store: %s=%q is not a boolean", KeyInsecureSkipVerify, v)
		}
		o.tls.InsecureSkipVerify = b
	}
	o.tls.CACertFile = config[KeyCACert]
	if config[keyCACert] != "" && o.tls.CACertFile == "" {
		// Velero passes the BSL's spec.objectStorage.caCert (PEM) inline.
		f, err := os.CreateTemp("", "revault-ca-*.pem")
		if err != nil {
			return err
		}
		if _, err := f.WriteString(config[keyCACert]); err != nil {
			return err
		}
		_ = f.Close()
		o.tls.CACertFile = f.Name()
	}
	for _, k := range []string{keyCredentialsFile, KeyTokenFile} {
		if p := config[k]; p != "" {
			t, err := readToken(p)
			if err != nil {
				return fmt.Errorf("revault.io/object-store: %s: %w", k, err)
			}
			o.token = t
			break
		}
	}
	if o.token == "" {
		name := config[KeyTokenSecret]
		if name == "" {
			name = kube.TokenSecret
		}
		t, err := secretToken(o.ns, name)
		if err != nil {
			return fmt.Errorf("revault.io/object-store: no token: set the BSL's credential (Secret %s, key %s) or config %s: %w",
				kube.TokenSecret, kube.TokenKey, KeyTokenFile, err)
		}
		o.token = t
	}
	return nil
}

// readToken reads a token file: the first word of the first line that is not a comment.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "token=") || strings.HasPrefix(line, "token:") {
			line = strings.TrimSpace(line[len("token="):])
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			return "", errors.New("the token line has no value")
		}
		return f[0], nil
	}
	return "", errors.New("no token in the file")
}

func secretToken(ns, name string) (string, error) {
	c, err := kube.Client()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
	defer cancel()
	t, err := kube.Token(ctx, c, ns, name)
	if err != nil {
		return "", err
	}
	if t == "" {
		return "", fmt.Errorf("secret %s/%s has no key %q", ns, name, kube.TokenKey)
	}
	return t, nil
}

// client returns the worker client of a bucket: the configured URL, or the worker the operator
// placed the bucket's BackupSeries on.
func (o *ObjectStore) client(bucket string) (*worker.Client, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if c, ok := o.clients[bucket]; ok {
		return c, nil
	}
	base := o.url
	if base == "" {
		kc, err := kube.Client()
		if err != nil {
			return nil, fmt.Errorf("no url in the BSL config and no Kubernetes API to find bucket %s's worker: %w", bucket, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), kubeTimeout)
		defer cancel()
		bs := &backupv1alpha1.BackupSeries{}
		if err := kc.Get(ctx, types.NamespacedName{Namespace: o.ns, Name: bucket}, bs); err != nil {
			return nil, fmt.Errorf("bucket %s: reading BackupSeries %s/%s (create it with source.external, or set url in the BSL config): %w",
				bucket, o.ns, bucket, err)
		}
		if bs.Status.Worker == nil || bs.Status.Worker.Endpoint == "" {
			return nil, fmt.Errorf("bucket %s: BackupSeries %s/%s is not placed on a worker yet", bucket, o.ns, bucket)
		}
		base = bs.Status.Worker.Endpoint
	}
	c, err := worker.New(base, o.token, o.tls)
	if err != nil {
		return nil, err
	}
	o.clients[bucket] = c
	return c, nil
}

func (o *ObjectStore) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), opTimeout)
}

// PutObject streams body to the worker.
func (o *ObjectStore) PutObject(bucket, key string, body io.Reader) error {
	c, err := o.client(bucket)
	if err != nil {
		return err
	}
	br := bufio.NewReaderSize(body, 64<<10)
	magic, _ := br.Peek(2)
	gzip := strings.HasSuffix(key, ".gz") && len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b
	obj, err := c.PutObject(context.Background(), o.ns, bucket, key, br, gzip)
	if err != nil {
		return fmt.Errorf("putting %s/%s: %w", bucket, key, err)
	}
	o.log.WithFields(logrus.Fields{"bucket": bucket, "key": key, "size": obj.Size, "uploaded": obj.UploadedBytes,
		"new": obj.NewBytes, "encoding": obj.Encoding}).Debug("stored object")
	return nil
}

// ObjectExists reports whether key exists.
func (o *ObjectStore) ObjectExists(bucket, key string) (bool, error) {
	c, err := o.client(bucket)
	if err != nil {
		return false, err
	}
	ctx, cancel := o.ctx()
	defer cancel()
	_, err = c.ObjectMeta(ctx, o.ns, bucket, key)
	switch {
	case err == nil:
		return true, nil
	case worker.IsNotFound(err):
		return false, nil
	default:
		return false, err
	}
}

// GetObject returns the object's body (gzip objects as gzip).
func (o *ObjectStore) GetObject(bucket, key string) (io.ReadCloser, error) {
	c, err := o.client(bucket)
	if err != nil {
		return nil, err
	}
	return c.GetObject(context.Background(), o.ns, bucket, key)
}

// ListCommonPrefixes returns the prefixes under prefix up to and including the delimiter.
func (o *ObjectStore) ListCommonPrefixes(bucket, prefix, delimiter string) ([]string, error) {
	c, err := o.client(bucket)
	if err != nil {
		return nil, err
	}
	ctx, cancel := o.ctx()
	defer cancel()
	_, prefixes, err := c.List(ctx, o.ns, bucket, prefix, delimiter)
	return prefixes, err
}

// ListObjects returns every key under prefix.
func (o *ObjectStore) ListObjects(bucket, prefix string) ([]string, error) {
	c, err := o.client(bucket)
	if err != nil {
		return nil, err
	}
	ctx, cancel := o.ctx()
	defer cancel()
	objs, _, err := c.List(ctx, o.ns, bucket, prefix, "")
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(objs))
	for i, ob := range objs {
		keys[i] = ob.Key
	}
	return keys, nil
}

// DeleteObject deletes key; a key that does not exist is not an error (as with S3).
func (o *ObjectStore) DeleteObject(bucket, key string) error {
	c, err := o.client(bucket)
	if err != nil {
		return err
	}
	ctx, cancel := o.ctx()
	defer cancel()
	if err := c.DeleteObject(ctx, o.ns, bucket, key); err != nil && !worker.IsNotFound(err) {
		return err
	}
	return nil
}

// CreateSignedURL returns a URL that reads key without a token until ttl passes (the worker
// caps it at 12 hours). With publicUrl in the config, the URL uses that address (for
// `velero backup logs` run outside the cluster).
func (o *ObjectStore) CreateSignedURL(bucket, key string, ttl time.Duration) (string, error) {
	c, err := o.client(bucket)
	if err != nil {
		return "", err
	}
	ctx, cancel := o.ctx()
	defer cancel()
	const maxTTL = 12 * time.Hour
	if ttl > maxTTL {
		ttl = maxTTL
	}
	path, err := c.SignURL(ctx, o.ns, bucket, key, ttl)
	if err != nil {
		return "", err
	}
	base := c.BaseURL
	if o.publicURL != "" {
		base = o.publicURL
	}
	return base + path, nil
}
