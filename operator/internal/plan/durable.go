package plan

import (
	"fmt"
	"time"
)

// Durability is what the Durable condition of a series says: whether the worker's remote holds
// the series' newest version.
type Durability struct {
	OK      bool
	Reason  string
	Message string
}

// DurabilityOf decides the Durable condition (reason InTime while the bucket keeps up: one
// reason, so a backup and its upload do not each add an event) from the newest version (latest, backed up at
// lastBackup) and the newest one the remote holds (durable; 0 for none). A version the bucket
// does not hold yet is normal for a while — the worker uploads in the background — so the
// condition turns False (RemoteBehind) only once the newest version is older than behindAfter.
func DurabilityOf(latest, durable int64, lastBackup time.Time, now time.Time, behindAfter time.Duration) Durability {
	switch {
	case latest == 0:
		return Durability{true, "NoVersions", "nothing to upload yet"}
	case durable >= latest:
		return Durability{true, "InTime", fmt.Sprintf("the remote holds version %d, the newest", latest)}
	}
	held := "no version"
	if durable > 0 {
		held = fmt.Sprintf("version %d", durable)
	}
	age := now.Sub(lastBackup)
	if age < behindAfter {
		return Durability{true, "InTime", fmt.Sprintf("the remote holds %s; version %d (backed up %s ago) is being uploaded", held, latest, age.Round(time.Second))}
	}
	return Durability{false, "RemoteBehind", fmt.Sprintf(
		"the remote holds %s, the newest is version %d, backed up %s ago (more than %s): check the worker's revault_remote_lag_seconds and the bucket",
		held, latest, age.Round(time.Second), behindAfter)}
}
