// Package plot draws simple charts (horizontal bars, line curves with optional log x-axis) into
// a PNG with nothing but the standard library: a raster canvas with filled rectangles, thick
// lines and a scaled 5×7 bitmap font. It exists so `router sim --plot` needs no plotting
// dependency; output is a pure function of the input, byte for byte.
package plot

import (
	"image"
	"image/color"
	"image/png"
	"io"
)

// Canvas is a white RGBA raster.
type Canvas struct {
	img *image.RGBA
}

// New returns a white canvas of w×h pixels.
func New(w, h int) *Canvas {
	c := &Canvas{img: image.NewRGBA(image.Rect(0, 0, w, h))}
	c.Fill(c.img.Bounds(), color.RGBA{255, 255, 255, 255})
	return c
}

// Bounds is the canvas rectangle.
func (c *Canvas) Bounds() image.Rectangle { return c.img.Bounds() }

// Image exposes the raster (for tests).
func (c *Canvas) Image() *image.RGBA { return c.img }

// EncodePNG writes the canvas as PNG.
func (c *Canvas) EncodePNG(w io.Writer) error { return png.Encode(w, c.img) }

// Fill paints r (clipped to the canvas) with col.
func (c *Canvas) Fill(r image.Rectangle, col color.RGBA) {
	r = r.Intersect(c.img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			c.img.SetRGBA(x, y, col)
		}
	}
}

// Line draws a segment of the given width (in pixels) from (x0,y0) to (x1,y1).
func (c *Canvas) Line(x0, y0, x1, y1, width int, col color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	lo, hi := -(width-1)/2, width/2
	for {
		c.Fill(image.Rect(x0+lo, y0+lo, x0+hi+1, y0+hi+1), col)
		if x0 == x1 && y0 == y1 {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			x0 += sx
		} else {
			e += dx
			y0 += sy
		}
	}
}

// Text draws s with its top-left corner at (x, y), each font pixel scale×scale screen pixels.
func (c *Canvas) Text(x, y int, s string, scale int, col color.RGBA) {
	for _, r := range s {
		g, drop := glyph(r)
		for row := 0; row < 7; row++ {
			for bit := 0; bit < 5; bit++ {
				if g[row]&(0x10>>bit) != 0 {
					px, py := x+bit*scale, y+(row+drop)*scale
					c.Fill(image.Rect(px, py, px+scale, py+scale), col)
				}
			}
		}
		x += 6 * scale
	}
}

// TextWidth is the width in pixels of s drawn at scale.
func TextWidth(s string, scale int) int {
	n := 0
	for range s {
		n++
	}
	if n == 0 {
		return 0
	}
	return (6*n - 1) * scale
}

// TextHeight is the height in pixels of a line of text at scale.
func TextHeight(scale int) int { return 7 * scale }

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func sign(x int) int {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return 0
}

// Palette is Tableau 10: distinct, colour-blind tolerable, pleasant next to each other.
var Palette = []color.RGBA{
	{0x4e, 0x79, 0xa7, 255}, {0xf2, 0x8e, 0x2b, 255}, {0xe1, 0x57, 0x59, 255},
	{0x76, 0xb7, 0xb2, 255}, {0x59, 0xa1, 0x4f, 255}, {0xed, 0xc9, 0x48, 255},
	{0xb0, 0x7a, 0xa1, 255}, {0xff, 0x9d, 0xa7, 255}, {0x9c, 0x75, 0x5f, 255},
	{0xba, 0xb0, 0xac, 255},
}

// Colours for chart furniture.
var (
	Black = color.RGBA{0x20, 0x20, 0x20, 255}
	Grey  = color.RGBA{0x80, 0x80, 0x80, 255}
	Light = color.RGBA{0xe4, 0xe4, 0xe4, 255}
)
