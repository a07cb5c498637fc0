package plot

import (
	"image"
	"image/color"
	"math"
	"strconv"
)

// Series is one set of bar values, one per category, drawn in one colour.
type Series struct {
	Name   string
	Values []float64
	Color  color.RGBA
}

// HBars is a horizontal bar chart: categories top to bottom, one bar per series in each.
type HBars struct {
	Title      string
	Categories []string
	Series     []Series
	Format     func(float64) string // value label at each bar's end; nil means %.3g
}

// Curve is one line of a line chart.
type Curve struct {
	Name  string
	X, Y  []float64
	Color color.RGBA
}

// Lines is a line chart (for example a CDF), optionally with a log-scaled x-axis.
type Lines struct {
	Title, XLabel string
	LogX          bool
	YMin, YMax    float64
	Curves        []Curve
}

const (
	titleScale = 3
	labelScale = 2
	pad        = 12
)

// DrawHBars draws b inside r.
func (c *Canvas) DrawHBars(r image.Rectangle, b HBars) {
	format := b.Format
	if format == nil {
		format = func(v float64) string { return strconv.FormatFloat(v, 'g', 3, 64) }
	}
	y := r.Min.Y + pad
	c.Text(r.Min.X+pad, y, b.Title, titleScale, Black)
	y += TextHeight(titleScale) + pad
	if len(b.Series) > 1 {
		y = c.legend(r.Min.X+pad, y, r.Max.X-pad, seriesKeys(b.Series)) + pad/2
	}
	labelW := 0
	for _, cat := range b.Categories {
		labelW = max(labelW, TextWidth(cat, labelScale))
	}
	valueW := 0
	var hi float64
	for _, s := range b.Series {
		for _, v := range s.Values {
			hi = max(hi, v)
			valueW = max(valueW, TextWidth(format(v), labelScale))
		}
	}
	plot := image.Rect(r.Min.X+pad+labelW+pad, y, r.Max.X-pad-valueW-pad, r.Max.Y-pad-TextHeight(labelScale)-pad)
	if plot.Dx() <= 0 || plot.Dy() <= 0 || len(b.Categories) == 0 {
		return
	}
	ticks := niceTicks(0, hi, 5)
	top := ticks[len(ticks)-1]
	xOf := func(v float64) int { return plot.Min.X + int(math.Round(v/top*float64(plot.Dx()))) }
	for _, t := range ticks {
		x := xOf(t)
		c.Fill(image.Rect(x, plot.Min.Y, x+1, plot.Max.Y), Light)
		s := tickLabel(t)
		c.Text(x-TextWidth(s, labelScale)/2, plot.Max.Y+pad/2, s, labelScale, Grey)
	}
	band := float64(plot.Dy()) / float64(len(b.Categories))
	barH := int(band * 0.8 / float64(len(b.Series)))
	for i, cat := range b.Categories {
		y0 := plot.Min.Y + int(band*float64(i)+band*0.1)
		c.Text(plot.Min.X-pad-TextWidth(cat, labelScale), y0+int(band*0.4)-TextHeight(labelScale)/2, cat, labelScale, Black)
		for j, s := range b.Series {
			if i >= len(s.Values) {
				continue
			}
			v := s.Values[i]
			yb := y0 + j*barH
			c.Fill(image.Rect(plot.Min.X, yb, xOf(v), yb+barH-1), s.Color)
			c.Text(xOf(v)+pad/2, yb+(barH-TextHeight(labelScale))/2, format(v), labelScale, Black)
		}
	}
	c.Fill(image.Rect(plot.Min.X, plot.Min.Y, plot.Min.X+2, plot.Max.Y), Black)
}

// DrawLines draws l inside r.
func (c *Canvas) DrawLines(r image.Rectangle, l Lines) {
	y := r.Min.Y + pad
	c.Text(r.Min.X+pad, y, l.Title, titleScale, Black)
	y += TextHeight(titleScale) + pad
	keys := make([]key, len(l.Curves))
	lo, hi := math.Inf(1), math.Inf(-1)
	for i, cv := range l.Curves {
		keys[i] = key{cv.Name, cv.Color}
		for _, x := range cv.X {
			if l.LogX && x <= 0 {
				continue
			}
			lo, hi = min(lo, x), max(hi, x)
		}
	}
	y = c.legend(r.Min.X+pad, y, r.Max.X-pad, keys) + pad
	if math.IsInf(lo, 0) {
		return
	}
	yt := niceTicks(l.YMin, l.YMax, 5)
	yw := 0
	for _, t := range yt {
		yw = max(yw, TextWidth(tickLabel(t), labelScale))
	}
	plot := image.Rect(r.Min.X+pad+yw+pad, y, r.Max.X-2*pad, r.Max.Y-2*pad-2*TextHeight(labelScale)-pad)
	if plot.Dx() <= 0 || plot.Dy() <= 0 {
		return
	}
	var xt []float64
	tx := func(v float64) float64 { return v }
	if l.LogX {
		tx = math.Log10
		lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
		for d := lo; d <= hi*1.0001; d *= 10 {
			xt = append(xt, d)
		}
	} else {
		xt = niceTicks(lo, hi, 6)
		lo, hi = xt[0], xt[len(xt)-1]
	}
	if tx(hi) == tx(lo) {
		hi = lo + 1
	}
	xOf := func(v float64) int {
		return plot.Min.X + int(math.Round((tx(v)-tx(lo))/(tx(hi)-tx(lo))*float64(plot.Dx())))
	}
	yOf := func(v float64) int {
		return plot.Max.Y - int(math.Round((v-l.YMin)/(l.YMax-l.YMin)*float64(plot.Dy())))
	}
	for _, t := range xt {
		x := xOf(t)
		c.Fill(image.Rect(x, plot.Min.Y, x+1, plot.Max.Y), Light)
		s := tickLabel(t)
		c.Text(x-TextWidth(s, labelScale)/2, plot.Max.Y+pad/2, s, labelScale, Grey)
	}
	for _, t := range yt {
		yy := yOf(t)
		c.Fill(image.Rect(plot.Min.X, yy, plot.Max.X, yy+1), Light)
		s := tickLabel(t)
		c.Text(plot.Min.X-pad/2-TextWidth(s, labelScale), yy-TextHeight(labelScale)/2, s, labelScale, Grey)
	}
	c.Text(plot.Min.X+(plot.Dx()-TextWidth(l.XLabel, labelScale))/2, plot.Max.Y+pad+TextHeight(labelScale)+pad/2, l.XLabel, labelScale, Black)
	c.Fill(image.Rect(plot.Min.X, plot.Max.Y, plot.Max.X, plot.Max.Y+2), Black)
	c.Fill(image.Rect(plot.Min.X-2, plot.Min.Y, plot.Min.X, plot.Max.Y+2), Black)
	for _, cv := range l.Curves {
		px, py, first := 0, 0, true
		for i := range cv.X {
			if i >= len(cv.Y) || (l.LogX && cv.X[i] <= 0) {
				continue
			}
			x, yy := xOf(cv.X[i]), yOf(cv.Y[i])
			if !first && (x != px || yy != py) {
				c.Line(px, py, x, yy, 3, cv.Color)
			}
			px, py, first = x, yy, false
		}
	}
}

type key struct {
	name string
	col  color.RGBA
}

func seriesKeys(ss []Series) []key {
	ks := make([]key, len(ss))
	for i, s := range ss {
		ks[i] = key{s.Name, s.Color}
	}
	return ks
}

// legend draws colour swatches with names left to right, wrapping at maxX, and returns the y
// below the last row.
func (c *Canvas) legend(x0, y, maxX int, keys []key) int {
	h := TextHeight(labelScale)
	x := x0
	for _, k := range keys {
		w := h + pad/2 + TextWidth(k.name, labelScale) + 2*pad
		if x > x0 && x+w > maxX {
			x, y = x0, y+h+pad/2
		}
		c.Fill(image.Rect(x, y, x+h, y+h), k.col)
		c.Text(x+h+pad/2, y, k.name, labelScale, Black)
		x += w
	}
	return y + h
}

// niceTicks returns about n evenly spaced round values (steps of 1, 2 or 5 × 10^k) covering
// [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	if !(hi > lo) {
		hi = lo + 1
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var ts []float64
	for t := math.Floor(lo/step) * step; ; t += step {
		ts = append(ts, roundTo(t, step))
		if t >= hi-step*1e-9 {
			break
		}
	}
	return ts
}

func roundTo(v, step float64) float64 {
	digits := max(0, -int(math.Floor(math.Log10(step))))
	p := math.Pow(10, float64(digits))
	return math.Round(v*p) / p
}

func tickLabel(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }
