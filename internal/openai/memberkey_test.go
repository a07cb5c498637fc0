package openai

import "testing"

// The keys the parsers look for are read without allocating; others are copied.
func TestMemberKeyAllocs(t *testing.T) {
	body := []byte(`"model""prompt""messages""max_tokens""stream""other"`)
	keys := [][]byte{body[1:6], body[8:14], body[16:24], body[26:36], body[38:44]}
	if n := testing.AllocsPerRun(100, func() {
		for _, k := range keys {
			if memberKey(k) != string(k) {
				t.Fatalf("memberKey(%q)", k)
			}
		}
	}); n != 0 {
		t.Fatalf("%v allocations for known keys", n)
	}
	other := body[46:51]
	k := memberKey(other)
	other[0] = 'X'
	if k != "other" {
		t.Fatalf("an unknown key shares the body's bytes: %q", k)
	}
}
