package flow

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseModelClasses reads "model=class,..." (the --priority-default flag): each model's class
// for requests that name none. Empty is none.
func ParseModelClasses(s string) (map[string]Class, error) {
	out := map[string]Class{}
	err := eachPair(s, func(k, v string) error {
		c, ok := ParseClass(v)
		if !ok {
			return fmt.Errorf("%q: class %q is not critical, standard or sheddable", k, v)
		}
		out[k] = c
		return nil
	})
	return out, err
}

// FormatModelClasses writes m as ParseModelClasses reads it, sorted by model.
func FormatModelClasses(m map[string]Class) string {
	var parts []string
	for k, c := range m {
		parts = append(parts, k+"="+c.String())
	}
	return strings.Join(sortStrings(parts), ",")
}

// ParseClassInts reads "class=n,..." over dst (classes not named keep their value).
func ParseClassInts(s string, dst *[NumClasses]int) error {
	return eachClass(s, func(c Class, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("%s=%q: want a count, 0 or more", c, v)
		}
		dst[c] = n
		return nil
	})
}

// ParseClassDurations reads "class=duration,..." over dst.
func ParseClassDurations(s string, dst *[NumClasses]time.Duration) error {
	return eachClass(s, func(c Class, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("%s=%q: want a positive duration", c, v)
		}
		dst[c] = d
		return nil
	})
}

// FormatClassInts and FormatClassDurations write what the Parse functions read.
func FormatClassInts(a [NumClasses]int) string {
	parts := make([]string, NumClasses)
	for c := range NumClasses {
		parts[c] = fmt.Sprintf("%s=%d", Class(c), a[c])
	}
	return strings.Join(parts, ",")
}

// FormatClassDurations writes a as ParseClassDurations reads it.
func FormatClassDurations(a [NumClasses]time.Duration) string {
	parts := make([]string, NumClasses)
	for c := range NumClasses {
		parts[c] = fmt.Sprintf("%s=%v", Class(c), a[c])
	}
	return strings.Join(parts, ",")
}

func eachClass(s string, f func(Class, string) error) error {
	return eachPair(s, func(k, v string) error {
		c, ok := ParseClass(k)
		if !ok {
			return fmt.Errorf("%q is not a class (critical, standard, sheddable)", k)
		}
		return f(c, v)
	})
}

func eachPair(s string, f func(k, v string) error) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		k, v, ok := strings.Cut(p, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return fmt.Errorf("%q: want key=value", p)
		}
		if err := f(k, v); err != nil {
			return err
		}
	}
	return nil
}

func sortStrings(a []string) []string {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j-1] > a[j]; j-- {
			a[j-1], a[j] = a[j], a[j-1]
		}
	}
	return a
}
