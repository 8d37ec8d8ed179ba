package main

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var (
	colBase  = color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff}
	colIdem  = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	colGoal  = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	colBase2 = color.RGBA{R: 0x55, G: 0x55, B: 0x55, A: 0xff}
	colIdem2 = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
)

// chartRatio is one bar of the ratio panel.
type chartRatio struct {
	label string
	value float64
	goal  float64 // NaN: no target
}

func (r *report) ratioBars() []chartRatio {
	var out []chartRatio
	for _, t := range r.targets {
		if t.ratio && t.short != "vs SQL design" {
			out = append(out, chartRatio{t.short, t.value, t.goal})
		}
	}
	out = append(out, r.chartExtra...)
	for _, s := range r.sections {
		if s.title == "2. HTTP: bare handler vs g.Middleware" {
			for _, p := range s.pairs {
				out = append(out, chartRatio{"HTTP " + p[1].name[len("g.Middleware, "):], ratio(p[1], p[0]), math.NaN()})
			}
		}
	}
	return out
}

// chart writes the four-panel PNG: ratios to baselines, throughput against
// concurrency, SQL vs idem, and memory overhead per record.
func (r *report) chart(path string) error {
	plots := [][]*plot.Plot{{r.ratioPlot(), r.scalePlot()}, {r.sqlPlot(), r.memPlot()}, {r.peersPlot(), r.peersHTTPPlot()}}
	const w, h = 16 * vg.Inch, 15 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(100))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	t := draw.Tiles{Rows: len(plots), Cols: 2, PadTop: vg.Points(10), PadBottom: vg.Points(10), PadLeft: vg.Points(10),
		PadRight: vg.Points(20), PadX: vg.Points(40), PadY: vg.Points(40)}
	canvases := plot.Align(plots, t, dc)
	for i := range plots {
		for j := range plots[i] {
			plots[i][j].Draw(canvases[i][j])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func emptyNote(p *plot.Plot, msg string) *plot.Plot {
	p.X.Label.Text = msg
	p.HideY()
	return p
}

func (r *report) ratioPlot() *plot.Plot {
	p := plot.New()
	p.Title.Text = "idem throughput / baseline (red: target)"
	bars := r.ratioBars()
	if len(bars) == 0 {
		return emptyNote(p, "no data")
	}
	vals := make(plotter.Values, len(bars))
	labels := make([]string, len(bars))
	for i, b := range bars {
		vals[i] = b.value
		if math.IsNaN(b.value) {
			vals[i] = 0
		}
		labels[i] = fmt.Sprintf("%s %.2f×", b.label, b.value)
	}
	bc, err := plotter.NewBarChart(vals, vg.Points(14))
	if err != nil {
		return emptyNote(p, err.Error())
	}
	bc.Horizontal = true
	bc.Color = colIdem
	bc.LineStyle.Width = 0
	p.Add(bc)
	for i, b := range bars {
		if math.IsNaN(b.goal) {
			continue
		}
		l, err := plotter.NewLine(plotter.XYs{{X: b.goal, Y: float64(i) - 0.45}, {X: b.goal, Y: float64(i) + 0.45}})
		if err == nil {
			l.Color = colGoal
			l.Width = vg.Points(2.5)
			p.Add(l)
		}
	}
	p.NominalY(labels...)
	p.X.Min = 0
	p.X.Max = math.Max(1.1, p.X.Max)
	p.X.Label.Text = "ratio (1 = as fast as the baseline)"
	p.Add(plotter.NewGrid())
	return p
}

func (r *report) scalePlot() *plot.Plot {
	p := plot.New()
	p.Title.Text = "throughput vs client concurrency (fresh keys)"
	if len(r.scaleStandalone) == 0 {
		return emptyNote(p, "no data")
	}
	add := func(pts []scalePoint, idem bool, name string, c color.Color, dashed bool) {
		if len(pts) == 0 {
			return
		}
		xy := make(plotter.XYs, len(pts))
		for i, s := range pts {
			v := s.raw
			if idem {
				v = s.fresh
			}
			xy[i] = plotter.XY{X: float64(s.clients), Y: v.opsPerSec()}
		}
		l, sc, err := plotter.NewLinePoints(xy)
		if err != nil {
			return
		}
		l.Color, sc.Color = c, c
		l.Width = vg.Points(2)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		}
		p.Add(l, sc)
		p.Legend.Add(name, l, sc)
	}
	add(r.scaleStandalone, false, "raw 2-RT floor, standalone", colBase2, false)
	add(r.scaleStandalone, true, "idem.Do, standalone", colIdem, false)
	add(r.scaleCluster, false, "raw 2-RT floor, 3-master cluster", colBase2, true)
	add(r.scaleCluster, true, "idem.Do, 3-master cluster", colIdem2, true)
	p.X.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for _, s := range r.scaleStandalone {
		ticks = append(ticks, plot.Tick{Value: float64(s.clients), Label: strconv.Itoa(s.clients)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Label.Text = "concurrent clients (log scale)"
	p.Y.Label.Text = "ops/s (median of rounds)"
	p.Y.Tick.Marker = opsTicks{}
	p.Y.Min = 0
	p.Legend.Top = false
	p.Legend.Left = false
	p.Legend.XOffs = vg.Points(-10)
	p.Legend.YOffs = vg.Points(10)
	p.Add(plotter.NewGrid())
	return p
}

func (r *report) sqlPlot() *plot.Plot {
	p := plot.New()
	p.Title.Text = "the SQL design on PostgreSQL vs idem, fresh keys, same clients"
	var vs []*variant
	for _, s := range r.sections {
		if s.title == "3. The SQL design on PostgreSQL vs idem" {
			for i, p := range s.pairs {
				if i == 0 {
					vs = append(vs, p[0])
				}
				vs = append(vs, p[1])
			}
		}
	}
	if len(vs) == 0 {
		return emptyNote(p, "PostgreSQL not measured")
	}
	cols := []color.Color{colBase, colIdem, colBase2}
	var names []string
	for i, v := range vs {
		bc, err := plotter.NewBarChart(plotter.Values{v.opsPerSec()}, vg.Points(60))
		if err != nil {
			return emptyNote(p, err.Error())
		}
		bc.XMin = float64(i)
		bc.Color = cols[i%len(cols)]
		bc.LineStyle.Width = 0
		p.Add(bc)
		label, _, _ := strings.Cut(v.name, " (")
		name := fmt.Sprintf("%s\n%.0f ops/s", label, v.opsPerSec())
		if i > 0 {
			name += fmt.Sprintf(" (%.1f×)", ratio(v, vs[0]))
		}
		names = append(names, name)
	}
	p.NominalX(names...)
	p.Y.Label.Text = "ops/s (median of rounds)"
	p.Y.Tick.Marker = opsTicks{}
	p.Y.Min = 0
	grid := plotter.NewGrid()
	grid.Vertical.Color = nil
	p.Add(grid)
	return p
}

func (r *report) memPlot() *plot.Plot {
	p := plot.New()
	p.Title.Text = "Redis memory per completed record, beyond the body (red: target 150 B)"
	if len(r.mem) == 0 {
		return emptyNote(p, "no data")
	}
	vals := make(plotter.Values, len(r.mem))
	base := make(plotter.Values, len(r.mem))
	labels := make([]string, len(r.mem))
	for i, m := range r.mem {
		vals[i] = m.overhead()
		base[i] = m.baseline - float64(m.body)
		labels[i] = fmt.Sprintf("%s, %d B: %s", m.how, m.body, strings.TrimPrefix(fmtOverhead(m.overhead()), "body "))
	}
	bb, bc, err := barPair(base, vals, 7, colBase, colIdem)
	if err != nil {
		return emptyNote(p, "no data")
	}
	p.Add(bb, bc)
	p.Legend.Add("plain SET of the body (Redis floor)", bb)
	p.Legend.Add("idem record (below 0: compressed)", bc)
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(5)
	l, err := plotter.NewLine(plotter.XYs{{X: 150, Y: -0.5}, {X: 150, Y: float64(len(r.mem)) - 0.5}})
	if err == nil {
		l.Color = colGoal
		l.Width = vg.Points(2)
		p.Add(l)
	}
	p.NominalY(labels...)
	p.X.Label.Text = "bytes beyond the body (MEMORY USAGE − body length)"
	p.Add(plotter.NewGrid())
	return p
}

// opsTicks marks an ops/s axis with round numbers, labelled in thousands.
type opsTicks struct{}

func (opsTicks) Ticks(lo, hi float64) []plot.Tick {
	span := hi - lo
	if span <= 0 {
		return nil
	}
	step := math.Pow(10, math.Floor(math.Log10(span/5)))
	for _, m := range []float64{1, 2, 5, 10} {
		if span/(step*m) <= 6 {
			step *= m
			break
		}
	}
	var ticks []plot.Tick
	for v := math.Ceil(lo/step) * step; v <= hi+step/1e6; v += step {
		label := strconv.FormatFloat(v/1000, 'f', -1, 64) + "k"
		if v == 0 {
			label = "0"
		}
		ticks = append(ticks, plot.Tick{Value: v, Label: label})
	}
	return ticks
}

// barPair returns two horizontal bar charts of width w points drawn side
// by side, one row per value: a in colour ca above b in colour cb.
func barPair(a, b plotter.Values, w float64, ca, cb color.Color) (ba, bb *plotter.BarChart, err error) {
	ba, err1 := plotter.NewBarChart(a, vg.Points(w))
	bb, err2 := plotter.NewBarChart(b, vg.Points(w))
	if err := errors.Join(err1, err2); err != nil {
		return nil, nil, err
	}
	for _, c := range []*plotter.BarChart{ba, bb} {
		c.Horizontal = true
		c.LineStyle.Width = 0
	}
	ba.Color, bb.Color = ca, cb
	ba.Offset, bb.Offset = vg.Points(-w/2), vg.Points(w/2)
	return ba, bb, nil
}
