package controller

import (
	"context"
	"fmt"
	"sort"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	backupv1alpha1 "github.com/revault-io/revault/operator/api/v1alpha1"
	"github.com/revault-io/revault/operator/internal/plan"
	"github.com/revault-io/revault/operator/pkg/workerclient"
)

// syncVersions reads the series' versions and sizes from its worker. A worker that does not
// answer does not end the reconcile (Synced says what failed): the series is looked at again
// sooner instead.
func (r *BackupSeriesReconciler) syncVersions(ctx context.Context, s *seriesRun) (ctrl.Result, bool, error) {
	if err := r.sync(ctx, s.bs, s.keepsAll, s.cs); err != nil {
		s.o.workerFailed = true
		s.requeue = min(s.requeue, 30*time.Second)
	}
	return proceed()
}

// sync reads the series' versions from its worker into status, and clears the worker's retention
// rules when keepsAll. A series the worker does not know yet (no backup so far) has no versions.
func (r *BackupSeriesReconciler) sync(ctx context.Context, bs *backupv1alpha1.BackupSeries, keepsAll bool, cs conditionSetter) error {
	st := &bs.Status
	api, err := r.Workers.API(ctx, st.Worker.Media, st.Worker.Node)
	if err != nil {
		return err
	}
	s, err := api.Series(ctx, bs.Namespace, bs.Name)
	switch {
	case workerclient.IsNotFound(err):
		s = &workerclient.SeriesDetail{}
	case err != nil:
		cs.setFalse(backupv1alpha1.ConditionSynced, "WorkerError", err.Error())
		return err
	}
	setVersions(st, s)
	r.setDurability(st, s, cs)
	r.setDiskPressure(ctx, api, st, cs)
	if keepsAll {
		if err := r.clearRetention(ctx, api, bs, s, cs); err != nil {
			return err
		}
	}
	msg := fmt.Sprintf("%d versions on the %s worker on node %s", st.VersionCount, st.Worker.Media, st.Worker.Node)
	cs.setTrue(backupv1alpha1.ConditionSynced, "WorkerAnswered", msg)
	return nil
}

// setDurability records the newest version the worker's remote holds, and the Durable
// condition; without a remote there is neither.
func (r *BackupSeriesReconciler) setDurability(st *backupv1alpha1.BackupSeriesStatus, s *workerclient.SeriesDetail, cs conditionSetter) {
	st.DurableVersion = 0
	if s.DurableVersion != nil {
		st.DurableVersion = *s.DurableVersion
	}
	if r.Config.Remote == nil {
		apimeta.RemoveStatusCondition(cs.conds, backupv1alpha1.ConditionDurable)
		return
	}
	var last time.Time
	if st.LastBackup != nil {
		last = st.LastBackup.Time
	}
	d := plan.DurabilityOf(st.LatestVersion, st.DurableVersion, last, r.Now(), r.Config.Remote.BehindAfter.Duration)
	if d.OK {
		cs.setTrue(backupv1alpha1.ConditionDurable, d.Reason, d.Message)
	} else {
		cs.setFalse(backupv1alpha1.ConditionDurable, d.Reason, d.Message)
	}
}

// setDiskPressure says on the series whether its worker is nearly full or its store degraded
// (plan.Candidate.NearlyFull): then the worker takes no new series, and this one's backups go on
// only until the disk is full. A worker that does not answer, or reports no room, leaves the
// condition as it was: Synced already tells of a worker that does not answer. With the check
// off (--min-free-percent=0) only a degraded store is said.
func (r *BackupSeriesReconciler) setDiskPressure(ctx context.Context, api *instrumented, st *backupv1alpha1.BackupSeriesStatus, cs conditionSetter) {
	s, err := api.Stats(ctx)
	if err != nil {
		return
	}
	c := plan.Candidate{Node: st.Worker.Node, Room: r.reportedRoom(s)}
	switch why := c.NearlyFull(); {
	case why != "":
		then := "fail once its disk is full; free room there or expire old versions"
		if c.Room.Degraded != "" {
			// Expiring is a write too: only room on the disk helps.
			then = "fail until room is freed on its disk (restores still work)"
		}
		cs.setTrue(backupv1alpha1.ConditionDiskPressure, "WorkerNearlyFull", fmt.Sprintf(
			"the %s worker on node %s has %s: it takes no new series, and this one's backups %s",
			st.Worker.Media, st.Worker.Node, why, then))
	case r.MinFreePercent == 0:
		apimeta.RemoveStatusCondition(cs.conds, backupv1alpha1.ConditionDiskPressure)
	case c.Room != nil:
		cs.setFalse(backupv1alpha1.ConditionDiskPressure, "WorkerHasRoom", fmt.Sprintf("the %s worker on node %s has %s",
			st.Worker.Media, st.Worker.Node, roomOf(c)))
	}
}

// setVersions writes the worker's versions of a series into its status: totals, the latest
// version, and the newest MaxStatusVersions of them in order.
func setVersions(st *backupv1alpha1.BackupSeriesStatus, s *workerclient.SeriesDetail) {
	versions := make([]backupv1alpha1.BackupVersion, 0, len(s.VersionList))
	var logical, stored int64
	for _, v := range s.VersionList {
		versions = append(versions, backupv1alpha1.BackupVersion{
			Number: v.Number, Time: metav1.NewTime(v.Time.UTC()), LogicalBytes: v.LogicalBytes,
			NewBytes: v.NewBytes, StoredBytes: v.StoredBytes, Form: backupv1alpha1.VersionForm(v.Form),
		})
		logical += v.LogicalBytes
		stored += v.StoredBytes
	}
	sort.Slice(versions, func(i, j int) bool { return versions[i].Number < versions[j].Number })
	st.VersionCount = int32(len(versions))
	st.LogicalBytes, st.StoredBytes = logical, stored
	st.DedupRatio = plan.Ratio(logical, stored)
	st.LatestVersion, st.LastBackup = 0, nil
	if n := len(versions); n > 0 {
		st.LatestVersion = versions[n-1].Number
		t := versions[n-1].Time
		st.LastBackup = &t
		if n > backupv1alpha1.MaxStatusVersions {
			versions = versions[n-backupv1alpha1.MaxStatusVersions:]
		}
	}
	if len(versions) == 0 {
		versions = nil
	}
	st.Versions = versions
}
