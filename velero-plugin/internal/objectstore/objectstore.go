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
	"sigs.k8s.io/controller-runtime/pkg/client"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/pkg/workerclient"
	"github.com/revault-io/revault/velero-plugin/internal/kube"
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
	// pageSize is how many entries a listing asks the worker for per page.
	pageSize = 1000
)

// ObjectStore implements velero.ObjectStore.
type ObjectStore struct {
	log       logrus.FieldLogger
	ns        string
	url       string
	publicURL string
	token     string
	tls       workerclient.TLSOptions
	// pageSize is how many entries each listing call asks for (pageSize unless a test sets it).
	pageSize int
	mu       sync.Mutex
	clients  map[string]*bucketWorker
}

// bucketWorker is the worker holding a bucket: its client and its address (signed URLs are
// relative to it).
type bucketWorker struct {
	*workerclient.ClientWithResponses
	base string
}

// New returns an uninitialised ObjectStore (Velero calls Init).
func New(log logrus.FieldLogger) *ObjectStore {
	return &ObjectStore{log: log, pageSize: pageSize, clients: map[string]*bucketWorker{}}
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
	if o.tls.CACertFile == "" {
		// Velero passes the BSL's spec.objectStorage.caCert (PEM) inline.
		o.tls.CACert = []byte(config[keyCACert])
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
func (o *ObjectStore) client(bucket string) (*bucketWorker, error) {
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
		if err := o.operatorCA(ctx, kc); err != nil {
			return nil, fmt.Errorf("bucket %s: %w", bucket, err)
		}
	}
	hc, err := workerclient.StreamingHTTPClient(o.tls)
	if err != nil {
		return nil, err
	}
	wc, err := workerclient.New(base, o.token, hc)
	if err != nil {
		return nil, err
	}
	c := &bucketWorker{wc, base}
	o.clients[bucket] = c
	return c, nil
}

// operatorCA trusts the CA bundle the operator gives the namespace (ConfigMap revault-ca) when
// the BSL names no CA of its own: a worker found through its BackupSeries serves the
// certificate of the operator's CA.
func (o *ObjectStore) operatorCA(ctx context.Context, kc client.Client) error {
	if o.tls.CACertFile != "" || len(o.tls.CACert) > 0 || o.tls.InsecureSkipVerify {
		return nil
	}
	pem, err := kube.CABundle(ctx, kc, o.ns)
	o.tls.CACert = pem
	return err
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
	params := &workerclient.PutObjectParams{Key: key}
	if strings.HasSuffix(key, ".gz") && len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gzip := workerclient.PutObjectParamsEncodingGzip
		params.Encoding = &gzip
	}
	obj, err := workerclient.Created(c.PutObjectWithBodyWithResponse(context.Background(), o.ns, bucket, params,
		"application/octet-stream", br))
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
	_, err = workerclient.JSON(c.GetObjectMetaWithResponse(ctx, o.ns, bucket, &workerclient.GetObjectMetaParams{Key: key}))
	switch {
	case err == nil:
		return true, nil
	case workerclient.IsNotFound(err):
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
	resp, err := c.GetObject(context.Background(), o.ns, bucket, &workerclient.GetObjectParams{Key: key})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// ListCommonPrefixes returns the prefixes under prefix up to and including the delimiter.
func (o *ObjectStore) ListCommonPrefixes(bucket, prefix, delimiter string) ([]string, error) {
	c, err := o.client(bucket)
	if err != nil {
		return nil, err
	}
	ctx, cancel := o.ctx()
	defer cancel()
	_, prefixes, err := o.list(ctx, c, bucket, prefix, delimiter)
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
	objs, _, err := o.list(ctx, c, bucket, prefix, "")
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
	err = workerclient.Done(c.DeleteObjectWithResponse(ctx, o.ns, bucket, &workerclient.DeleteObjectParams{Key: key}))
	if err != nil && !workerclient.IsNotFound(err) {
		return err
	}
	return nil
}

// list returns every object under prefix and, with a delimiter, the common prefixes, walking all
// pages. The worker lists a bucket it does not have yet as empty: a bucket comes into being with
// its first object, and Velero lists a new backup storage location (to validate it) before it
// writes one.
func (o *ObjectStore) list(ctx context.Context, c *bucketWorker, bucket, prefix, delimiter string) (
	[]workerclient.Object, []string, error) {
	var objects []workerclient.Object
	var prefixes []string
	q := workerclient.ListObjectsParams{Prefix: &prefix, Limit: &o.pageSize}
	if delimiter != "" {
		q.Delimiter = &delimiter
	}
	for {
		page, err := workerclient.JSON(c.ListObjectsWithResponse(ctx, o.ns, bucket, &q))
		if err != nil {
			return nil, nil, err
		}
		objects = append(objects, page.Objects...)
		prefixes = append(prefixes, page.CommonPrefixes...)
		if page.NextStartAfter == nil || *page.NextStartAfter == "" {
			return objects, prefixes, nil
		}
		q.StartAfter = page.NextStartAfter
	}
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
	secs := max(int64(ttl/time.Second), 1)
	signed, err := workerclient.JSON(c.SignObjectUrlWithResponse(ctx, o.ns, bucket,
		workerclient.SignRequest{Key: key, TtlSeconds: &secs}))
	if err != nil {
		return "", err
	}
	base := c.base
	if o.publicURL != "" {
		base = o.publicURL
	}
	return base + signed.Url, nil
}
