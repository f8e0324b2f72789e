package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RetentionPolicySpec says which versions of a series are kept and how many stay in the live
// window. A version is kept when any rule keeps it (restic's forget policy, planned by the
// worker); the newest version and the live window are always kept.
// +kubebuilder:validation:XValidation:rule="has(self.keepVersions) || has(self.keepWithin) || has(self.keepHourly) || has(self.keepDaily) || has(self.keepWeekly) || has(self.keepMonthly) || has(self.keepYearly)",message="set at least one of keepVersions, keepWithin, keepHourly, keepDaily, keepWeekly, keepMonthly, keepYearly"
// +kubebuilder:validation:XValidation:rule="!has(self.timeZone) || has(self.keepHourly) || has(self.keepDaily) || has(self.keepWeekly) || has(self.keepMonthly) || has(self.keepYearly)",message="timeZone only applies to keepHourly, keepDaily, keepWeekly, keepMonthly and keepYearly"
// +kubebuilder:validation:XValidation:rule="!has(self.keepVersions) || !has(self.liveVersions) || self.liveVersions <= self.keepVersions",message="liveVersions must not exceed keepVersions"
type RetentionPolicySpec struct {
	// KeepVersions keeps the newest N versions.
	// +kubebuilder:validation:Minimum=1
	// +optional
	KeepVersions *int32 `json:"keepVersions,omitempty"`

	// KeepWithin keeps the versions taken less than this duration before the newest version
	// (not the clock, so a series that stopped backing up is never emptied), e.g. "720h";
	// whole seconds, and a duration under one second is no rule (as restic's 0).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$')",message="keepWithin must be a duration such as \"720h\" or \"36h30m\" (units h, m, s, ms, us, ns)"
	// +optional
	KeepWithin *metav1.Duration `json:"keepWithin,omitempty"`

	// KeepHourly keeps the newest version of each of the last N hours that have one.
	// +kubebuilder:validation:Minimum=1
	// +optional
	KeepHourly *int32 `json:"keepHourly,omitempty"`

	// KeepDaily keeps the newest version of each of the last N days that have one.
	// +kubebuilder:validation:Minimum=1
	// +optional
	KeepDaily *int32 `json:"keepDaily,omitempty"`

	// KeepWeekly keeps the newest version of each of the last N ISO weeks (Monday to Sunday)
	// that have one.
	// +kubebuilder:validation:Minimum=1
	// +optional
	KeepWeekly *int32 `json:"keepWeekly,omitempty"`

	// KeepMonthly keeps the newest version of each of the last N months that have one.
	// +kubebuilder:validation:Minimum=1
	// +optional
	KeepMonthly *int32 `json:"keepMonthly,omitempty"`

	// KeepYearly keeps the newest version of each of the last N years that have one.
	// +kubebuilder:validation:Minimum=1
	// +optional
	KeepYearly *int32 `json:"keepYearly,omitempty"`

	// TimeZone is the IANA time zone (e.g. "Europe/Berlin") in which hours, days, weeks, months
	// and years begin for the keepHourly..keepYearly rules; unset means UTC. A name the worker
	// does not know is reported in the Applied condition and nothing is expired.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$`
	// +optional
	TimeZone *string `json:"timeZone,omitempty"`

	// LiveVersions is the live window: the newest versions that reference whole segments and
	// restore fastest. Older kept versions are reverse-deduplicated (archival).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:default=1
	// +optional
	LiveVersions *int32 `json:"liveVersions,omitempty"`

	// ExpirySchedule is a cron schedule (CronJob format) on which the operator slides and
	// expires every series using this policy. Empty: the worker slides and expires after every
	// backup. Either way the policy is applied once right after it changes.
	// +kubebuilder:validation:MaxLength=100
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || self.matches('^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|[0-9*?/,A-Za-z-]+( +[0-9*?/,A-Za-z-]+){4})$')",message="expirySchedule must be a cron schedule of five fields (e.g. \"30 3 * * *\") or @hourly/@daily/@weekly/@monthly/@yearly"
	// +optional
	ExpirySchedule string `json:"expirySchedule,omitempty"`
}

// SeriesRetentionStatus is what the policy did to one series.
type SeriesRetentionStatus struct {
	// Name of the BackupSeries.
	Name string `json:"name"`
	// UID of the BackupSeries (a series recreated under the same name starts afresh).
	// +optional
	UID string `json:"uid,omitempty"`
	// AppliedGeneration is the policy generation last pushed to the series' worker.
	// +optional
	AppliedGeneration int64 `json:"appliedGeneration,omitempty"`
	// PendingExpiry lists the versions the policy does not keep and that are still stored
	// (they go at the next expiry).
	// +optional
	// +listType=atomic
	PendingExpiry []int64 `json:"pendingExpiry,omitempty"`
	// LastExpired lists the versions the last expiry deleted.
	// +optional
	// +listType=atomic
	LastExpired []int64 `json:"lastExpired,omitempty"`
	// LastSlid lists the versions the last slide moved to the archival window.
	// +optional
	// +listType=atomic
	LastSlid []int64 `json:"lastSlid,omitempty"`
	// BytesReclaimed by this policy's slides and expiries of the series.
	// +optional
	BytesReclaimed int64 `json:"bytesReclaimed,omitempty"`
	// Message is the worker's error when the last attempt failed.
	// +optional
	Message string `json:"message,omitempty"`
}

// RetentionPolicyStatus reports what the policy did.
type RetentionPolicyStatus struct {
	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// SeriesCount is the number of BackupSeries using the policy.
	// +optional
	SeriesCount int32 `json:"seriesCount,omitempty"`

	// LastSlideTime is when the operator last ran slides for the policy's series.
	// +optional
	LastSlideTime *metav1.Time `json:"lastSlideTime,omitempty"`

	// LastExpiryTime is when the operator last ran expiries for the policy's series.
	// +optional
	LastExpiryTime *metav1.Time `json:"lastExpiryTime,omitempty"`

	// NextExpiryTime is the next scheduled run (with an expirySchedule).
	// +optional
	NextExpiryTime *metav1.Time `json:"nextExpiryTime,omitempty"`

	// BytesReclaimed by all slides and expiries the operator ran for this policy.
	// +optional
	BytesReclaimed int64 `json:"bytesReclaimed,omitempty"`

	// Series lists the series using the policy.
	// +optional
	// +listType=map
	// +listMapKey=name
	Series []SeriesRetentionStatus `json:"series,omitempty"`

	// Conditions: Applied, Scheduled.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RetentionPolicy decides which versions of the series that reference it are kept.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rtp,categories=revault
// +kubebuilder:printcolumn:name="Keep",type=integer,JSONPath=`.spec.keepVersions`
// +kubebuilder:printcolumn:name="Within",type=string,JSONPath=`.spec.keepWithin`
// +kubebuilder:printcolumn:name="Daily",type=integer,JSONPath=`.spec.keepDaily`,priority=1
// +kubebuilder:printcolumn:name="Weekly",type=integer,JSONPath=`.spec.keepWeekly`,priority=1
// +kubebuilder:printcolumn:name="Monthly",type=integer,JSONPath=`.spec.keepMonthly`,priority=1
// +kubebuilder:printcolumn:name="Live",type=integer,JSONPath=`.spec.liveVersions`
// +kubebuilder:printcolumn:name="Series",type=integer,JSONPath=`.status.seriesCount`
// +kubebuilder:printcolumn:name="Last Expiry",type=date,JSONPath=`.status.lastExpiryTime`
// +kubebuilder:printcolumn:name="Reclaimed",type=integer,JSONPath=`.status.bytesReclaimed`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RetentionPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RetentionPolicySpec   `json:"spec"`
	Status RetentionPolicyStatus `json:"status,omitempty"`
}

// RetentionPolicyList is a list of RetentionPolicy.
// +kubebuilder:object:root=true
type RetentionPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RetentionPolicy `json:"items"`
}

func init() {
	SchemeBuilder.Register(&RetentionPolicy{}, &RetentionPolicyList{})
}
