// Package toolresult is the contract between e2e-tool (which runs in the cluster) and the suite
// (which reads the tool pods' logs): every command prints one line, Prefix followed by its
// result as JSON.
package toolresult

// Prefix starts the line of a command's result.
const Prefix = "RESULT: "

// Gen is what `e2e-tool gen` wrote.
type Gen struct {
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"` // content bytes of all regular files
}

// Mutate is what `e2e-tool mutate` changed.
type Mutate struct {
	Rewritten      []string `json:"rewritten"`
	RewrittenBytes int64    `json:"rewrittenBytes"`
	AddedBytes     int64    `json:"addedBytes"`
	Removed        string   `json:"removed"`
}

// Sum is the manifest `e2e-tool sum` made of a tree.
type Sum struct {
	Entries int      `json:"entries"`
	Bytes   int64    `json:"bytes"`
	Digest  string   `json:"digest"`
	Lines   []string `json:"lines"`
}

// APICall is one answer `e2e-tool api` got from a worker.
type APICall struct {
	Request string `json:"request"`
	Status  int    `json:"status"`
	Code    string `json:"code,omitempty"`
	Body    string `json:"body"`
}

// SlowPush is what `e2e-tool slowpush` sent over one connection held open for a while, and what
// it read back over a new one.
type SlowPush struct {
	Status   int     `json:"status"`
	Body     string  `json:"body"`
	Version  int64   `json:"version"`
	Bytes    int64   `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	Sent     string  `json:"sent"`     // sha256 of the body sent
	Restored string  `json:"restored"` // sha256 of the version read back
	// ReadTries is how many GETs the read-back took (more than one: the worker was restarting).
	ReadTries int `json:"readTries"`
	// Answered is when the worker's answer to the upload arrived (RFC 3339, UTC).
	Answered string `json:"answered"`
}

// ReadBack is `e2e-tool readback`'s result: a version read again.
type ReadBack struct {
	Version  int64  `json:"version"`
	Restored string `json:"restored"` // sha256 of the version's bytes
	Tries    int    `json:"tries"`
}
