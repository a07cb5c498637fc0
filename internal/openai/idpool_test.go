package openai

import "testing"

func TestIDPoolClasses(t *testing.T) {
	for _, n := range []int{1, 256, 257, 8192, 1 << 17} {
		ids := newIDs(n)
		if len(ids) != 0 || cap(ids) < n || cap(ids) > max(2*n, 1<<minPooledIDBits) {
			t.Fatalf("newIDs(%d): len %d cap %d", n, len(ids), cap(ids))
		}
		ReleaseIDs(append(ids, 7))
	}
	if ids := newIDs(1<<17 + 1); cap(ids) != 1<<17+1 {
		t.Fatalf("a prompt beyond the largest class got cap %d", cap(ids))
	}
	ReleaseIDs(make([]uint32, 3, 300)) // not a pooled capacity: ignored, not handed out short
	for range 100 {
		if ids := newIDs(300); cap(ids) < 300 {
			t.Fatalf("newIDs(300) handed out cap %d", cap(ids))
		}
	}
}

// A released slice is handed out again empty, and a parse into it is correct.
func TestParseAfterRelease(t *testing.T) {
	c, err := ParseCompletion([]byte(`{"model":"m","prompt":[5,6,7]}`))
	if err != nil {
		t.Fatal(err)
	}
	ReleaseIDs(c.Prompt.Items[0].IDs)
	c2, err := ParseCompletion([]byte(`{"model":"m","prompt":[9]}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := c2.Prompt.Items[0].IDs; len(got) != 1 || got[0] != 9 {
		t.Fatalf("ids after release = %v, want [9]", got)
	}
}
