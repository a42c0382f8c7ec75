package main

import (
	"fmt"
	"image/color"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// writeChart draws the upstream WATCH rate over time of both storms, one
// line each, into a PNG (or SVG, by the file's extension) at path.
func writeChart(path string, clients int, direct, through stormResult) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Upstream WATCH requests reaching kube-apiserver: %d clients looping on a stale resourceVersion", clients)
	p.X.Label.Text = "time since the storm started (s)"
	p.Y.Label.Text = "WATCH requests per second, each second (apiserver_request_total)"
	p.X.Min, p.Y.Min = 0, 0
	p.X.Tick.Marker = plot.TickerFunc(func(min, max float64) []plot.Tick {
		var ticks []plot.Tick
		for s := 0.0; s <= max; s++ {
			ticks = append(ticks, plot.Tick{Value: s, Label: fmt.Sprintf("%.0f", s)})
		}
		return ticks
	})
	p.Y.Tick.Marker = plot.TickerFunc(func(min, max float64) []plot.Tick {
		ticks := plot.DefaultTicks{}.Ticks(min, max)
		for i := range ticks {
			if ticks[i].Label != "" {
				ticks[i].Label = fmt.Sprintf("%.0f", ticks[i].Value)
			}
		}
		return ticks
	})
	p.Add(plotter.NewGrid())
	for _, s := range []struct {
		name   string
		points []ratePoint
		color  color.Color
		dashes []vg.Length
	}{
		{fmt.Sprintf("direct to kube-apiserver (%s)", count(direct.upstream, "upstream WATCH", "upstream WATCHes")), direct.rate, color.RGBA{R: 200, G: 40, B: 40, A: 255}, nil},
		{fmt.Sprintf("through watchgate (%s)", count(through.upstream, "upstream WATCH", "upstream WATCHes")), through.rate, color.RGBA{R: 20, G: 90, B: 200, A: 255}, []vg.Length{vg.Points(6), vg.Points(3)}},
	} {
		xy := make(plotter.XYs, len(s.points))
		for i, pt := range s.points {
			xy[i].X, xy[i].Y = pt.at.Seconds(), pt.perSecond
		}
		line, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		line.Color = s.color
		line.Width = vg.Points(2)
		line.Dashes = s.dashes
		p.Add(line)
		p.Legend.Add(s.name, line)
	}
	// Headroom above the highest point keeps the legend off the lines.
	top := 1.0
	for _, pts := range [][]ratePoint{direct.rate, through.rate} {
		for _, pt := range pts {
			top = max(top, pt.perSecond)
		}
	}
	p.Y.Max = top * 1.3
	p.Legend.Top = true
	p.Legend.Padding = vg.Points(4)
	p.Legend.XOffs = -vg.Points(12)
	p.Legend.YOffs = -vg.Points(4)
	p.Legend.ThumbnailWidth = vg.Points(30)
	p.Title.Padding = vg.Points(6)
	return p.Save(10*vg.Inch, 5*vg.Inch, path)
}
