package frontdoor

import (
	"errors"
	"net/http"

	"github.com/prefixmesh/prefixmesh/internal/openai"
	"github.com/prefixmesh/prefixmesh/router/requests"
)

// ErrConfig is wrapped by every Validate error. The request service's refusals are its own
// sentinels (requests.ErrNoNodes, ErrOverloaded, ErrDraining), answered here as HTTP: 503, 429,
// 503 with Connection: close.
var ErrConfig = errors.New("frontdoor: invalid config")

// Error codes the front door itself answers with.
const (
	codeInvalid       = openai.CodeInvalid
	codeTooLarge      = "request_too_large"
	codeNotFound      = "not_found"
	codeModelNotFound = requests.CodeModelNotFound
	codeMethod        = "method_not_allowed"
	codeOverloaded    = "router_overloaded"
	codeNoNodes       = "no_nodes_available"
	codeUpstream      = "upstream_unavailable"
	codeDraining      = "router_draining"
	codeTokenize      = "tokenize_failed"
	codeBodyTimeout   = "request_timeout"
)

// writeError writes an OpenAI-shaped error (internal/openai: param null, Retry-After on 429
// and 503).
func writeError(w http.ResponseWriter, status int, code, msg string) {
	openai.WriteError(w, &openai.Error{Status: status, Code: code, Message: msg})
}
