package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestWriteChartWritesAPNG(t *testing.T) {
	var direct, through stormResult
	for i := 1; i <= 40; i++ {
		at := time.Duration(i) * 250 * time.Millisecond
		direct.rate = append(direct.rate, ratePoint{at: at, perSecond: float64(150 + 10*(i%5))})
		through.rate = append(through.rate, ratePoint{at: at, perSecond: float64(max(0, 20-10*i))})
	}
	direct.upstream, through.upstream = 1600, 10
	path := filepath.Join(t.TempDir(), "chart.png")
	if dir := os.Getenv("DEMO_CHART_DIR"); dir != "" {
		path = filepath.Join(dir, "chart.png") // to look at it
	}
	if err := writeChart(path, 20, direct, through); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if w := img.Bounds().Dx(); w < 500 {
		t.Errorf("chart is %d pixels wide, want a readable size", w)
	}
}
