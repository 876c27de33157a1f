package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// plotName is the PNG file of a family's latency CDFs.
func plotName(family string) string {
	switch family {
	case famRandom:
		return "fileops-random.png"
	case famMeta:
		return "fileops-metadata.png"
	case famSeq:
		return "fileops-sequential.png"
	case famCache:
		return "fileops-cache.png"
	case famSmall:
		return "fileops-smallfiles.png"
	}
	return ""
}

// Line colours per target, the same in every plot.
var targetColor = map[string]color.Color{
	targetWeir:     color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // red
	targetOS:       color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
	targetOSDirect: color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // green
}

// hasData reports whether a family has a measured row with a distribution.
func (r *report) hasData(family string) bool {
	for i := range r.Rows {
		if row := &r.Rows[i]; row.Family == family && measured(row) && len(row.CDF) > 0 {
			return true
		}
	}
	return false
}

// plot writes one PNG per family that has data: a panel per workload, a
// line per target, the cumulative fraction of ops against latency on a
// log axis. It returns the file names.
func (r *report) plot(dir string) ([]string, error) {
	var names []string
	for _, fam := range families {
		if !r.hasData(fam) {
			continue
		}
		var workloads []string
		for i := range r.Rows {
			row := &r.Rows[i]
			if row.Family == fam && !contains(workloads, row.Workload) {
				workloads = append(workloads, row.Workload)
			}
		}
		var panels []*plot.Plot
		for _, wl := range workloads {
			p, err := r.panel(fam, wl)
			if err != nil {
				return nil, err
			}
			panels = append(panels, p)
		}
		name := plotName(fam)
		if err := savePanels(filepath.Join(dir, name), panels); err != nil {
			return nil, fmt.Errorf("plot %s: %w", name, err)
		}
		names = append(names, name)
	}
	return names, nil
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// panel is one workload's CDFs.
func (r *report) panel(family, wl string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = family + ": " + wl
	p.X.Label.Text = "latency, µs (log scale)"
	p.Y.Label.Text = "fraction of ops at or below"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = logTicks{}
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	p.Legend.Top = false
	p.Legend.Left = false
	minX := math.Inf(1)
	for _, t := range allTargets {
		row := r.find(family, wl, t)
		if !measured(row) || len(row.CDF) == 0 {
			continue
		}
		// A step line: at each bucket bound the fraction jumps from the
		// previous point's.
		pts := make(plotter.XYs, 0, 2*len(row.CDF))
		prev := 0.0
		for _, c := range row.CDF {
			x := max(c.Us, 0.01) // the log axis needs x > 0
			minX = min(minX, x)
			pts = append(pts, plotter.XY{X: x, Y: prev}, plotter.XY{X: x, Y: c.Fraction})
			prev = c.Fraction
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		l.Color = targetColor[t]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(t, l)
	}
	if !math.IsInf(minX, 1) {
		// Start the axis at a power of ten, so that it has a label.
		p.X.Min = math.Pow(10, math.Floor(math.Log10(minX)))
	}
	return p, nil
}

// savePanels draws the panels side by side into one PNG.
func savePanels(path string, panels []*plot.Plot) error {
	const panelW, panelH = 5 * vg.Inch, 3.6 * vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(panelW*vg.Length(len(panels)), panelH), vgimg.UseDPI(110))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(panels), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2,
		PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	canvases := plot.Align([][]*plot.Plot{panels}, tiles, dc)
	for j, p := range panels {
		p.Draw(canvases[0][j])
	}
	f, err := os.Create(path + ".tmp")
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// logTicks marks 1–9 × 10^k on a log axis and labels 1, 2 and 5 × 10^k,
// or only the powers of ten when the axis spans more than three decades.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= lo {
		return nil
	}
	wide := math.Log10(hi/lo) > 3
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); math.Pow(10, e) <= hi; e++ {
		for m := 1.0; m <= 9; m++ {
			v := m * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || (!wide && (m == 2 || m == 5)) {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}
