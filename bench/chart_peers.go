package main

import (
	"fmt"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// peersPlot shows scenario 7's Go API throughput, fresh and replay, of idem
// and each alternative.
func (r *report) peersPlot() *plot.Plot {
	p := plot.New()
	p.Title.Text = "idem vs the alternatives, Go API, 16 clients (ops/s, median of rounds)"
	d := r.peers
	if d == nil || len(d.goFresh) == 0 || len(d.goFresh) != len(d.goReplay) {
		return emptyNote(p, "not measured")
	}
	n := len(d.goFresh)
	fresh, replay := make(plotter.Values, n), make(plotter.Values, n)
	labels := make([]string, n)
	for i := range n {
		fresh[i], replay[i] = d.goFresh[i].opsPerSec(), d.goReplay[i].opsPerSec()
		name := strings.SplitN(d.goFresh[i].name, ":", 2)[0]
		labels[i] = fmt.Sprintf("%s\nfresh %s RT, replay %s RT", name, fmtRT(d.goFresh[i].rtPerOp()), fmtRT(d.goReplay[i].rtPerOp()))
	}
	bf, br, err := barPair(fresh, replay, 12, colIdem, colIdem2)
	if err != nil {
		return emptyNote(p, "no data")
	}
	p.Add(bf, br)
	p.Legend.Add("fresh keys", bf)
	p.Legend.Add("replays", br)
	p.Legend.Top = false // bottom right: idem.Do's bars are the lowest row
	p.Legend.XOffs = vg.Points(-10)
	p.Legend.YOffs = vg.Points(10)
	p.NominalY(labels...)
	p.X.Min = 0
	for i := range n { // room on the right for the legend
		p.X.Max = max(p.X.Max, 1.2*max(fresh[i], replay[i]))
	}
	p.X.Tick.Marker = opsTicks{}
	p.X.Label.Text = "ops/s"
	p.Add(plotter.NewGrid())
	return p
}

// fmtRT renders round trips per operation: whole for a plain client, two
// decimals for an auto-pipelined one (a batch is one round trip).
func fmtRT(x float64) string {
	if x == float64(int(x)) {
		return fmt.Sprintf("%.0f", x)
	}
	return fmtF(x, 2)
}

// peersHTTPPlot shows what share of its own bare handler's throughput each
// HTTP middleware keeps (scenario 7b).
func (r *report) peersHTTPPlot() *plot.Plot {
	p := plot.New()
	p.Title.Text = "HTTP middlewares: throughput kept vs the bare handler on the same server"
	d := r.peers
	if d == nil || len(d.httpPairs) == 0 {
		return emptyNote(p, "not measured")
	}
	vals := make(plotter.Values, len(d.httpPairs))
	labels := make([]string, len(d.httpPairs))
	for i, pr := range d.httpPairs {
		vals[i] = ratio(pr[1], pr[0])
		labels[i] = fmt.Sprintf("%s %.2f×", pr[1].name, vals[i])
	}
	bc, err := plotter.NewBarChart(vals, vg.Points(14))
	if err != nil {
		return emptyNote(p, err.Error())
	}
	bc.Horizontal = true
	bc.Color = colIdem
	bc.LineStyle.Width = 0
	p.Add(bc)
	p.NominalY(labels...)
	p.X.Min = 0
	p.X.Max = 1
	p.X.Label.Text = "middleware ops/s ÷ bare handler ops/s (same server)"
	p.Add(plotter.NewGrid())
	return p
}
