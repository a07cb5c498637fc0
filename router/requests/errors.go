package requests

import "errors"

// Sentinel errors of the package; callers test them with errors.Is. The doors map them to their
// own answers: 503 or UNAVAILABLE for no node, 429 or RESOURCE_EXHAUSTED for overload.
var (
	// ErrNoNodes: no node can serve the request.
	ErrNoNodes = errors.New("requests: no node can serve the request")
	// ErrOverloaded: every candidate is over its load bound, or the router's own in-flight cap
	// is reached.
	ErrOverloaded = errors.New("requests: overloaded")
	// ErrDraining: the router is shutting down and admits nothing new.
	ErrDraining = errors.New("requests: draining")
	// ErrConfig is wrapped by every Validate error.
	ErrConfig = errors.New("requests: invalid config")
)

// CodeModelNotFound is the OpenAI error code of a request for a model no node serves (404), as
// vLLM answers it.
const CodeModelNotFound = "model_not_found"
