package plan

import (
	"encoding/json"
	"strings"
)

// JobOutput is what a backup or restore pod reported: `revault push|pull --json` prints one
// JSON report on success; on failure it prints {"error": {"code", "message"}} and a line
// "error: MESSAGE" (the worker's message when the worker refused).
type JobOutput struct {
	// Report is the JSON report of a successful run (nil if none was found).
	Report json.RawMessage
	// Error is the failure message (empty if none was found).
	Error string
}

// ParseJobOutput reads a pod's termination message or log tail, newest first: the first JSON
// report, JSON error or "error:" line found from the end wins. The CLI pretty-prints its JSON,
// so a JSON value is tried from every line that starts with '{' in the first column (nested
// objects are indented and never start there). Other lines (progress, warnings) are skipped;
// when nothing matches, the last non-empty line is the error so a crash message is not lost.
func ParseJobOutput(text string) JobOutput {
	text = strings.ReplaceAll(text, "\r\n", "\n")
	lines := strings.Split(text, "\n")
	// Byte offset of each line's start.
	offsets := make([]int, len(lines))
	for i, pos := 0, 0; i < len(lines); i++ {
		offsets[i] = pos
		pos += len(lines[i]) + 1
	}
	lastNonEmpty := ""
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" {
			continue
		}
		if lastNonEmpty == "" {
			lastNonEmpty = l
		}
		if strings.HasPrefix(l, "error:") {
			return JobOutput{Error: strings.TrimSpace(strings.TrimPrefix(l, "error:"))}
		}
		if !strings.HasPrefix(lines[i], "{") {
			continue
		}
		var raw json.RawMessage
		if json.NewDecoder(strings.NewReader(text[offsets[i]:])).Decode(&raw) != nil {
			continue
		}
		var probe map[string]json.RawMessage
		if json.Unmarshal(raw, &probe) != nil {
			continue
		}
		if e, ok := probe["error"]; ok {
			var em struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			}
			if json.Unmarshal(e, &em) == nil && em.Message != "" {
				return JobOutput{Error: em.Message}
			}
			var s string
			if json.Unmarshal(e, &s) == nil && s != "" {
				return JobOutput{Error: s}
			}
			continue
		}
		return JobOutput{Report: raw}
	}
	return JobOutput{Error: lastNonEmpty}
}

// PushReport is the part of `revault push --json`'s report the operator uses: the version the
// backup made (nil when the report names none) and its sizes.
type PushReport struct {
	Version      *int64 `json:"version"`
	LogicalBytes int64  `json:"logicalBytes"`
	NewBytes     int64  `json:"newBytes"`
}

// ParsePushReport decodes a backup report.
func ParsePushReport(raw json.RawMessage) (PushReport, error) {
	var r PushReport
	err := json.Unmarshal(raw, &r)
	return r, err
}

// PullReport is the part of `revault pull --json`'s report the operator shows: what the client
// received and the worker's restore report (container reads, speed factor).
type PullReport struct {
	Series  string  `json:"series"`
	Version *int64  `json:"version"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	Server  *struct {
		LogicalBytes   int64    `json:"logicalBytes"`
		ContainerReads int64    `json:"containerReads"`
		BytesRead      int64    `json:"bytesRead"`
		SpeedFactor    *float64 `json:"speedFactor"`
		Seconds        float64  `json:"seconds"`
		State          string   `json:"state"`
	} `json:"server"`
}

// RestoredBytes is the logical size restored (the worker's figure; for a directory the
// client's byte count includes tar headers).
func (r PullReport) RestoredBytes() int64 {
	if r.Server != nil && r.Server.LogicalBytes > 0 {
		return r.Server.LogicalBytes
	}
	return r.Bytes
}

// ParsePullReport decodes a restore report.
func ParsePullReport(raw json.RawMessage) (PullReport, error) {
	var r PullReport
	err := json.Unmarshal(raw, &r)
	return r, err
}
