package testutil

import (
	velerov1 "github.com/vmware-tanzu/velero/pkg/apis/velero/v1"
	"github.com/vmware-tanzu/velero/pkg/plugin/velero"
	"k8s.io/apimachinery/pkg/runtime"
)

// BackupAction is what a BackupItemAction v2 offers to Execute: the plugin's own action, or
// one Velero's plugin manager reaches over gRPC.
type BackupAction interface {
	Execute(item runtime.Unstructured, backup *velerov1.Backup) (
		runtime.Unstructured, []velero.ResourceIdentifier, string, []velero.ResourceIdentifier, error)
}

// Executed is what an Execute returned.
type Executed struct {
	Item        runtime.Unstructured
	Extra, Post []velero.ResourceIdentifier
	Op          string
	Err         error
}

// ExecuteAsync runs a.Execute in the background (it returns only once the volume was read) and
// delivers what it returned on the channel.
func ExecuteAsync(a BackupAction, item runtime.Unstructured, backup *velerov1.Backup) <-chan Executed {
	out := make(chan Executed, 1)
	go func() {
		var r Executed
		r.Item, r.Extra, r.Op, r.Post, r.Err = a.Execute(item, backup)
		out <- r
	}()
	return out
}
