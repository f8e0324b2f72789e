// Command velero-plugin-revault is Revault's Velero plugin: one binary serving
//
//	revault.io/object-store           ObjectStore: backup storage locations in a Revault worker
//	revault.io/pvc-backup             BackupItemAction v2: PVC data into a Revault series
//	revault.io/pvc-restore            RestoreItemAction v2: that data back before workloads start
//	revault.io/skip-operator-objects  RestoreItemAction v2: the operator's Jobs and RestoreJobs stay out
//	revault.io/pvc-delete             DeleteItemAction: deleting a Velero backup expires its versions
//
// Velero runs it over gRPC (hashicorp/go-plugin). `velero-plugin-revault install DIR` copies the
// binary into DIR: the entrypoint of the plugin image's init container, which has no shell.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"
	"github.com/spf13/pflag"
	"github.com/vmware-tanzu/velero/pkg/plugin/framework"

	"github.com/revault-io/revault/velero-plugin/internal/actions"
	"github.com/revault-io/revault/velero-plugin/internal/objectstore"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "install" {
		if err := install(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "velero-plugin-revault install:", err)
			os.Exit(1)
		}
		return
	}
	framework.NewServer().
		BindFlags(pflag.CommandLine).
		RegisterObjectStore("revault.io/object-store", func(l logrus.FieldLogger) (any, error) {
			return objectstore.New(l), nil
		}).
		RegisterBackupItemActionV2("revault.io/pvc-backup", func(l logrus.FieldLogger) (any, error) {
			return &actions.PVCBackup{Log: l}, nil
		}).
		RegisterRestoreItemActionV2("revault.io/pvc-restore", func(l logrus.FieldLogger) (any, error) {
			return &actions.PVCRestore{Log: l}, nil
		}).
		RegisterRestoreItemActionV2("revault.io/skip-operator-objects", func(l logrus.FieldLogger) (any, error) {
			return &actions.SkipOperatorObjects{Log: l}, nil
		}).
		RegisterDeleteItemAction("revault.io/pvc-delete", func(l logrus.FieldLogger) (any, error) {
			return &actions.PVCDelete{Log: l}, nil
		}).
		Serve()
}

// install copies this executable into dir (Velero's plugins volume), atomically.
func install(dir string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	src, err := os.Open(self)
	if err != nil {
		return err
	}
	defer func() { _ = src.Close() }()
	dst := filepath.Join(dir, filepath.Base(self))
	tmp, err := os.CreateTemp(dir, ".velero-plugin-revault-*")
	if err != nil {
		return err
	}
	if _, err := io.Copy(tmp, src); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return err
	}
	fmt.Println("installed", dst)
	return nil
}
