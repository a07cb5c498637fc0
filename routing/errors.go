package routing

import "errors"

// Sentinel errors of the package; callers test them with errors.Is.
var (
	// ErrUnknownNode: a delta arrived for a node the index has no snapshot of. The caller pulls a
	// full summary (ReplaceNode) and resumes from its sequence number.
	ErrUnknownNode = errors.New("routing: unknown node (no snapshot yet)")
	// ErrEpoch: a delta carries another epoch than the index knows for the node (the node's
	// process restarted, so its cache is new). The caller must ReplaceNode with a fresh snapshot.
	ErrEpoch = errors.New("routing: epoch mismatch")
	// ErrGap: a delta starts after the node's known sequence number, so some changes were missed.
	// The caller must repair with a full snapshot.
	ErrGap = errors.New("routing: sequence gap")
	// ErrInvalid: malformed input (toSeq < fromSeq, mismatched slice lengths, an empty node id).
	ErrInvalid = errors.New("routing: invalid argument")
	// ErrNoCandidates: a policy was asked to choose among zero nodes.
	ErrNoCandidates = errors.New("routing: no candidate nodes")
	// ErrUnknownPolicy: NewPolicy was given a name not in PolicyNames.
	ErrUnknownPolicy = errors.New("routing: unknown policy")
	// ErrOverloaded: every candidate is at the decider's in-flight cap or over the policy's load
	// guard.
	ErrOverloaded = errors.New("routing: every candidate is overloaded")
)
