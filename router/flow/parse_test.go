package flow

import (
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	m, err := ParseModelClasses(" llama=critical , batch=Sheddable")
	if err != nil || m["llama"] != Critical || m["batch"] != Sheddable || len(m) != 2 {
		t.Fatalf("%v %v", m, err)
	}
	if got := FormatModelClasses(m); got != "batch=sheddable,llama=critical" {
		t.Fatalf("format %q", got)
	}
	for _, bad := range []string{"x", "a=urgent", "=critical", "a="} {
		if _, err := ParseModelClasses(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	lim := DefaultLimits()
	if err := ParseClassInts("sheddable=3", &lim.MaxQueued); err != nil || lim.MaxQueued != [NumClasses]int{1024, 1024, 3} {
		t.Fatalf("%v %v", lim.MaxQueued, err)
	}
	if err := ParseClassDurations("critical=2m,standard=1s", &lim.MaxWait); err != nil ||
		lim.MaxWait != [NumClasses]time.Duration{2 * time.Minute, time.Second, 10 * time.Second} {
		t.Fatalf("%v %v", lim.MaxWait, err)
	}
	if FormatClassDurations(lim.MaxWait) != "critical=2m0s,standard=1s,sheddable=10s" || FormatClassInts(lim.MaxQueued) != "critical=1024,standard=1024,sheddable=3" {
		t.Fatal(FormatClassDurations(lim.MaxWait), FormatClassInts(lim.MaxQueued))
	}
	for _, bad := range []string{"urgent=1", "critical=-1", "critical=x"} {
		if err := ParseClassInts(bad, &lim.MaxQueued); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if err := ParseClassDurations("standard=0s", &lim.MaxWait); err == nil {
		t.Error("a zero wait parsed")
	}
}
