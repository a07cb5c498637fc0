package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Error is a client-visible error: an HTTP status, OpenAI's error code, the request field at
// fault (Param, "" when none) and a message that names fields as the client wrote them.
type Error struct {
	Status  int
	Code    string
	Param   string
	Message string
}

func (e *Error) Error() string { return e.Message }

// CodeInvalid is the code of a request the server refuses as written (400).
const CodeInvalid = "invalid_request"

// Invalid returns a 400 naming param.
func Invalid(param, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: CodeInvalid, Param: param, Message: fmt.Sprintf(format, args...)}
}

func invalidParam(param, format string, args ...any) error { return Invalid(param, format, args...) }

// ErrorBody is the OpenAI error envelope, {"error": {"message", "type", "param", "code"}}: the
// shape every OpenAI client library parses (param and code are null when absent, as OpenAI
// sends them).
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody.
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// NewErrorBody builds the envelope for an error of the given status.
func NewErrorBody(status int, code, param, msg string) ErrorBody {
	b := ErrorBody{Error: ErrorDetail{Message: msg, Type: ErrorType(status)}}
	if param != "" {
		b.Error.Param = &param
	}
	if code != "" {
		b.Error.Code = &code
	}
	return b
}

// ErrorType is OpenAI's error type for a status.
func ErrorType(status int) string {
	switch {
	case status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case status >= 500:
		return "server_error"
	case status == http.StatusNotFound:
		return "not_found_error"
	}
	return "invalid_request_error"
}

// DefaultRetryAfter is the Retry-After (seconds) of a 429 or 503 whose writer did not set one:
// OpenAI's client libraries honour it, and one second is several request lifetimes at the load
// where a server refuses work.
const DefaultRetryAfter = "1"

// WriteError writes e as an OpenAI error body. Every 429 and 503 carries Retry-After (the
// caller's, or DefaultRetryAfter), so clients back off instead of hammering.
func WriteError(w http.ResponseWriter, e *Error) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	if (e.Status == http.StatusTooManyRequests || e.Status == http.StatusServiceUnavailable) && h.Get("Retry-After") == "" {
		h.Set("Retry-After", DefaultRetryAfter)
	}
	w.WriteHeader(e.Status)
	// The client may be gone; nothing to do about a write error.
	_ = json.NewEncoder(w).Encode(NewErrorBody(e.Status, e.Code, e.Param, e.Message))
}
