package requests

import "testing"

func TestBodyClasses(t *testing.T) {
	for _, c := range []struct{ n, class int }{{1, 0}, {4096, 0}, {4097, 1}, {1 << 20, BodyClasses - 1}, {1<<20 + 1, -1}} {
		if got := BodyClass(c.n); got != c.class {
			t.Errorf("BodyClass(%d) = %d, want %d", c.n, got, c.class)
		}
		if c.class >= 0 {
			if got := BodyClassBytes(c.class); got < c.n || (c.class > 0 && got/2 >= c.n) {
				t.Errorf("class %d of a %d-byte body holds %d bytes", c.class, c.n, got)
			}
			bp := GetBody(c.class)
			if len(*bp) != BodyClassBytes(c.class) {
				t.Errorf("GetBody(%d) is %d bytes, want %d", c.class, len(*bp), BodyClassBytes(c.class))
			}
			PutBody(c.class, bp)
		}
	}
}
