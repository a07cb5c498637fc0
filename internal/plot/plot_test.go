package plot

import (
	"bytes"
	"image"
	"slices"
	"testing"
)

func TestNiceTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		n      int
		want   []float64
	}{
		{0, 1, 5, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}},
		{0, 9.5, 5, []float64{0, 2, 4, 6, 8, 10}},
		{0, 78.4, 5, []float64{0, 20, 40, 60, 80}},
		{0, 0, 5, []float64{0, 0.2, 0.4, 0.6, 0.8, 1}},
	} {
		if got := niceTicks(tc.lo, tc.hi, tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("niceTicks(%v, %v, %d) = %v, want %v", tc.lo, tc.hi, tc.n, got, tc.want)
		}
	}
}

func TestText(t *testing.T) {
	if w := TextWidth("ab", 2); w != 22 {
		t.Fatalf("TextWidth = %d, want 22", w)
	}
	c := New(40, 20)
	c.Text(1, 1, "I", 1, Black)
	// 'I' is a 3-pixel bar on top and bottom and a stem in the middle column.
	img := c.Image()
	if img.RGBAAt(3, 4) != Black || img.RGBAAt(1, 4) == Black {
		t.Fatal("glyph not drawn where expected")
	}
	// Unprintable runes draw as '?' rather than panicking.
	c.Text(10, 1, "é\x00", 1, Black)
}

// TestChartsDeterministic draws every chart, including degenerate inputs, twice and compares
// the PNG bytes.
func TestChartsDeterministic(t *testing.T) {
	draw := func() []byte {
		c := New(800, 600)
		c.DrawHBars(image.Rect(0, 0, 400, 300), HBars{Title: "bars", Categories: []string{"a", "bb"},
			Series: []Series{{Name: "x", Values: []float64{1, 2}, Color: Palette[0]}, {Name: "y", Values: []float64{3}, Color: Palette[1]}}})
		c.DrawHBars(image.Rect(400, 0, 800, 300), HBars{Title: "empty"})
		c.DrawLines(image.Rect(0, 300, 800, 600), Lines{Title: "cdf", XLabel: "s", LogX: true, YMax: 1,
			Curves: []Curve{{Name: "a", X: []float64{0, 0.01, 0.1, 2}, Y: []float64{0, 0.3, 0.6, 1}, Color: Palette[2]}, {Name: "none"}}})
		c.DrawLines(image.Rect(0, 0, 10, 10), Lines{Title: "too small", YMax: 1, Curves: []Curve{{X: []float64{1}, Y: []float64{1}}}})
		var b bytes.Buffer
		if err := c.EncodePNG(&b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	if !bytes.Equal(draw(), draw()) {
		t.Fatal("same input, different PNG")
	}
}
