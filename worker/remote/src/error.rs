//! What the durable tier can fail with. Every message names the remote or the object, so an
//! operator reading a log line knows which bucket and which key to look at.

pub type Result<T, E = RemoteError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// An object that does not open: changed, truncated, moved or sealed under another key.
    /// It is never served.
    #[error("object {object} in the remote is corrupt or was tampered with: {detail}")]
    Tampered { object: String, detail: String },

    #[error("object {object} is missing from the remote")]
    NotFound { object: String },

    /// The store could not be reached in time (network, timeouts, 5xx after retries).
    #[error("the remote is unreachable ({what}): {detail}")]
    Unreachable { what: String, detail: String },

    /// Credentials refused (401/403), or the bucket belongs to someone else.
    #[error("the remote refused {what}: {detail}")]
    Denied { what: String, detail: String },

    #[error("the key file does not open the remote {remote}: {detail}")]
    WrongKey { remote: String, detail: String },

    /// Another store took this remote over (`revault recover` elsewhere): this one must not
    /// write to it any more.
    #[error("the remote {remote} was taken over by a newer store (generation {theirs}, this store is generation {ours}{by}); this store no longer writes to it. See docs/remote.md, \"Fencing\"", by = if .by.is_empty() { String::new() } else { format!(", recovered by {}", .by) })]
    Fenced {
        remote: String,
        ours: u32,
        theirs: u32,
        by: String,
    },

    /// The bucket holds a newer state of this store than this store does: its metadata went
    /// back in time, or a copy of it writes to the same remote. Nothing is uploaded or
    /// deleted until someone decides.
    #[error("the remote {remote} holds a newer state of this store than this store has ({detail}): its metadata went back in time (a disk snapshot put back?), or a copy of this store writes to the same remote. Nothing was uploaded or deleted; to go on from the remote's state, rebuild the store with `revault recover` (docs/remote.md, \"Fencing\")")]
    Diverged { remote: String, detail: String },

    #[error("{remote} already holds a Revault store ({detail}); rebuild a store from it with `revault recover`, or choose another prefix")]
    Exists { remote: String, detail: String },

    #[error("{remote} holds no Revault store ({detail})")]
    NoStore { remote: String, detail: String },

    #[error("invalid argument: {0}")]
    Invalid(String),

    /// Someone else changed what this command read and meant to replace; nothing of theirs
    /// was overwritten.
    #[error("{what}: {detail}")]
    Conflict { what: String, detail: String },

    #[error("the remote failed ({what}): {detail}")]
    Bucket { what: String, detail: String },

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error(transparent)]
    Engine(#[from] revault_engine::Error),
}

impl RemoteError {
    pub fn tampered(object: &str, detail: &str) -> Self {
        RemoteError::Tampered {
            object: object.to_string(),
            detail: detail.to_string(),
        }
    }

    /// The machine-readable code (the CLI's `--json`, the server's error bodies).
    pub fn code(&self) -> &'static str {
        match self {
            RemoteError::Tampered { .. } => "remote_corrupt",
            RemoteError::NotFound { .. } => "remote_missing_object",
            RemoteError::Unreachable { .. } => "remote_unavailable",
            RemoteError::Denied { .. } => "remote_denied",
            RemoteError::WrongKey { .. } => "wrong_key",
            RemoteError::Fenced { .. } => "remote_fenced",
            RemoteError::Diverged { .. } => "remote_diverged",
            RemoteError::Exists { .. } => "remote_exists",
            RemoteError::NoStore { .. } => "remote_empty",
            RemoteError::Invalid(_) => "invalid_argument",
            RemoteError::Conflict { .. } => "remote_conflict",
            RemoteError::Bucket { .. } => "remote_error",
            RemoteError::Io { .. } => "io_error",
            RemoteError::Engine(e) => e.kind().code(),
        }
    }

    /// Whether trying again later may succeed (the background uploader retries these
    /// quietly; everything else is reported at once).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RemoteError::Unreachable { .. } | RemoteError::Bucket { .. }
        )
    }

    /// The engine's view of a failure while reading a container from the remote: what a
    /// restore, slide or gc reports.
    pub fn into_engine(self, container: &str) -> revault_engine::Error {
        use revault_engine::Error as E;
        match self {
            RemoteError::Engine(e) => e,
            RemoteError::Tampered { object, detail } => E::CorruptContainer {
                container: container.to_string(),
                detail: format!("its copy in the remote ({object}) does not open: {detail}"),
            },
            RemoteError::NotFound { object } => E::MissingContainer {
                container: container.to_string(),
                path: std::path::PathBuf::from(format!("not there, nor in the remote as {object}")),
            },
            other => E::RemoteUnavailable(format!(
                "reading container {container} from the remote: {other}"
            )),
        }
    }
}

/// Adds what was being done to an I/O error.
pub(crate) trait IoCtx<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoCtx<T> for std::io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| RemoteError::Io {
            context: what(),
            source,
        })
    }
}
