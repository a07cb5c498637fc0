package cluster

import "errors"

var (
	// ErrInvalid reports a malformed or out-of-range message or configuration value.
	ErrInvalid = errors.New("invalid")
	// ErrTooLarge reports an encoding that exceeds its size cap.
	ErrTooLarge = errors.New("too large")
	// ErrVersion reports a wire format version this build does not speak.
	ErrVersion = errors.New("unsupported version")
	// ErrTruncated reports a message that ends before its fields do.
	ErrTruncated = errors.New("truncated")
	// ErrClosed reports use of an agent after Close.
	ErrClosed = errors.New("closed")
)
