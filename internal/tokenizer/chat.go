package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ChatMessage is one message of an OpenAI chat request. Content is the message's text; in JSON it
// may be a string, null, or an array of content parts of which the text parts (the types vLLM
// reads as text: text, input_text, output_text, refusal, thinking) are concatenated in order
// (other part types, such as images, are not supported and are rejected).
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// RenderChat renders messages with the one chat template prefixmesh uses everywhere, so that the
// router and the engine tokenise a chat request to the same ids:
//
//	<|role|>\n content \n    for each message, in order
//	<|assistant|>\n          the generation prompt
//
// For example [{user, "Hi"}] renders as "<|user|>\nHi\n<|assistant|>\n". Roles and content are
// copied verbatim. A conversation that extends another one renders to text that starts with the
// other's rendering minus its final generation prompt, so multi-turn chats share their prefix.
func RenderChat(messages []ChatMessage) string {
	n := len("<|assistant|>\n")
	for _, m := range messages {
		n += len(m.Role) + len(m.Content) + 5
	}
	var sb strings.Builder
	sb.Grow(n)
	for _, m := range messages {
		sb.WriteString("<|")
		sb.WriteString(m.Role)
		sb.WriteString("|>\n")
		sb.WriteString(m.Content)
		sb.WriteString("\n")
	}
	sb.WriteString("<|assistant|>\n")
	return sb.String()
}

// UnmarshalJSON accepts content as a string, null, or an array of text parts: "text",
// "input_text" and "output_text" ({"text": …}), "refusal" ({"refusal": …}) and "thinking".
func (m *ChatMessage) UnmarshalJSON(data []byte) error {
	var raw struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	m.Role = raw.Role
	m.Content = ""
	c := bytes.TrimSpace(raw.Content)
	switch {
	case len(c) == 0 || bytes.Equal(c, []byte("null")):
		return nil
	case c[0] == '"':
		return json.Unmarshal(c, &m.Content)
	case c[0] == '[':
		var parts []struct {
			Type     string  `json:"type"`
			Text     *string `json:"text"`
			Refusal  *string `json:"refusal"`
			Thinking *string `json:"thinking"`
		}
		if err := json.Unmarshal(c, &parts); err != nil {
			return fmt.Errorf("content parts: %w", err)
		}
		var sb strings.Builder
		for i, p := range parts {
			// The part types vLLM reads as text (vllm/entrypoints/chat_utils.py, MM_PARSER_MAP).
			var t *string
			switch p.Type {
			case "text", "input_text", "output_text":
				t = p.Text
			case "refusal":
				t = p.Refusal
			case "thinking":
				t = p.Thinking
			default:
				return fmt.Errorf("content part %d: only text parts are supported, got type %q", i, p.Type)
			}
			if t == nil {
				if p.Type == "text" || p.Type == "refusal" {
					continue // vLLM skips these without content
				}
				return fmt.Errorf("content part %d: a %q part needs its text", i, p.Type)
			}
			sb.WriteString(*t)
		}
		m.Content = sb.String()
		return nil
	}
	return errors.New("content must be a string, null or an array of text parts")
}
