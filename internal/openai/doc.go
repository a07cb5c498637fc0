// Package openai parses the parts of OpenAI-API requests that prefixmesh acts on, once, for the
// router's front door and the simulated engine alike, so both accept exactly the same requests
// and name the same field when they refuse one. The body is decoded by encoding/json (one linear
// pass) into the shared fields with the prompt kept raw; ParsePrompt then reads the prompt in a
// single forward pass with a hand-written scanner that accepts only OpenAI's four shapes (a
// string, an array of token ids, an array of strings, an array of arrays of token ids: one level
// of batch), refuses null ids and ids outside uint32, and stops at a third level of arrays where
// it begins. Trial decoding (string? ids? batch? then recurse) cost time quadratic in the nesting
// depth, which made a 20 KB body of nested arrays cost seconds of CPU. Errors are *Error values
// with the HTTP status, OpenAI's code, the request field at fault (param) and a message written
// in JSON's terms; WriteError writes them in OpenAI's envelope, with Retry-After on every 429
// and 503. The ids of a single token-id prompt come from pooled slices; a caller that is done
// with them hands them back with ReleaseIDs (the front door does, per request).
package openai
