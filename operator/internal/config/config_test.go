package config

import (
	"strings"
	"testing"
)

func TestParseDefaults(t *testing.T) {
	c, err := Parse([]byte("worker: {image: img:1}\npools: [{media: ssd}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Worker.Port != 8420 || c.Worker.HostPath != "/var/lib/revault" || c.Jobs.Image != "img:1" ||
		*c.Jobs.BackoffLimit != 3 || *c.Jobs.TTLSecondsAfterFinished != 86400 || c.Worker.Command[0] != "revault" ||
		c.Jobs.ImagePullPolicy != "IfNotPresent" {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if _, ok := c.Pool("ssd"); !ok {
		t.Errorf("pool ssd missing")
	}
	if _, ok := c.Pool("hdd"); ok {
		t.Errorf("pool hdd should not exist")
	}
}

func TestParseRemote(t *testing.T) {
	c, err := Parse([]byte("worker: {image: i}\npools: [{media: ssd}]\nremote: {url: s3://backups/cluster-a, keySecret: revault-remote-key}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := c.Remote
	if r.SyncInterval.Duration != DefaultSyncInterval || r.LostNodeTimeout.Duration != DefaultLostNodeTimeout ||
		r.BehindAfter.Duration != DefaultBehindAfter || r.EvictAfter.Duration != 0 {
		t.Errorf("remote defaults not applied: %+v", r)
	}
	if got := r.StoreURL("ssd", "node1"); got != "s3://backups/cluster-a/ssd/node1" {
		t.Errorf("store URL %s", got)
	}
}

func TestParseErrors(t *testing.T) {
	cases := map[string]string{
		"pools: [{media: ssd}]":                                                                                  "worker.image is required",
		"worker: {image: i}":                                                                                     "at least one pool",
		"worker: {image: i}\npools: [{media: nvme}]":                                                             `pools[0].media "nvme" must be ssd or hdd`,
		"worker: {image: i}\npools: [{media: ssd}, {media: ssd}]":                                                `media "ssd" appears twice`,
		"worker: {image: i, hostPath: data}\npools: [{media: ssd}]":                                              "must be absolute",
		"worker: {image: i, port: 70000}\npools: [{media: ssd}]":                                                 "is not a port",
		"worker: {image: i, logFormat: xml}\npools: [{media: ssd}]":                                              "must be text or json",
		"worker: {image: i, dedupDomain: tenant}\npools: [{media: ssd}]":                                         "must be store or namespace",
		"worker: {image: i, env: [{name: '1X', value: v}]}\npools: [{media: ssd}]":                               `worker.env[0].name "1X"`,
		"worker: {image: i, env: [{value: v}]}\npools: [{media: ssd}]":                                           `worker.env[0].name ""`,
		"worker: {image: i}\npools: [{media: ssd}]\njobs: {backoffLimit: -1}":                                    "must not be negative",
		"worker: {image: i}\npools: [{media: ssd}]\nnamespace: Not_A_Namespace":                                  "namespace:",
		"worker: {image: i}\npools: [{media: ssd}]\nunknownField: 1":                                             "unknown field",
		"worker: {image: i}\npools: [{media: ssd}]\nremote: {url: s3://b, keySecret: k}":                         `remote.url "s3://b"`,
		"worker: {image: i}\npools: [{media: ssd}]\nremote: {url: 'http://bucket', keySecret: k}":                "must be s3://BUCKET",
		"worker: {image: i}\npools: [{media: ssd}]\nremote: {url: s3://bucket/p/, keySecret: k}":                 "must be s3://BUCKET",
		"worker: {image: i}\npools: [{media: ssd}]\nremote: {url: s3://bucket}":                                  `remote.keySecret ""`,
		"worker: {image: i}\npools: [{media: ssd}]\nremote: {url: s3://bucket, keySecret: k, endpoint: rgw:80}":  "http:// or https://",
		"worker: {image: i}\npools: [{media: ssd}]\nremote: {url: s3://bucket, keySecret: k, syncInterval: -1s}": "remote.syncInterval must not be negative",
		"worker: {image: i}\npools: [{media: ssd}]\ntls: {certValidity: 1m}":                                     "tls.certValidity 1m0s must be at least 10m0s",
		"worker: {image: i}\npools: [{media: ssd}]\ntls: {certValidity: 48h, caValidity: 72h}":                   "tls.caValidity 72h0m0s must be at least twice",
		"worker: {image: i}\npools: [{media: ssd}]\ntls: {certValidity: 1h, caValidity: 72h}":                    "tls.caValidity 72h0m0s must be at least 96h0m0s",
		"worker: {image: i}\npools: [{media: ssd}]\ntls: {secret: Bad_Name}":                                     `tls.secret "Bad_Name"`,
	}
	for in, want := range cases {
		if _, err := Parse([]byte(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v; want an error containing %q", in, err, want)
		}
	}
}
