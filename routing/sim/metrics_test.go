package sim

import (
	"math"
	"reflect"
	"testing"
)

func TestPercentile(t *testing.T) {
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(i + 1)
	}
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct {
		data []float64
		p    float64
		want float64
	}{
		{hundred, 50, 50}, {hundred, 99, 99}, {hundred, 100, 100}, {hundred, 1, 1}, {hundred, 0.1, 1},
		{ten, 50, 5}, {ten, 99, 10}, {ten, 90, 9}, {ten, 91, 10},
		{[]float64{7}, 50, 7}, {[]float64{7}, 99, 7},
		{nil, 50, 0},
	} {
		if got := Percentile(tc.data, tc.p); got != tc.want {
			t.Errorf("Percentile(%d values, %v) = %v, want %v", len(tc.data), tc.p, got, tc.want)
		}
	}
}

func TestImbalance(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{1, 1, 1, 1}, 1},
		{[]float64{4, 0, 0, 0}, 4},
		{[]float64{3, 1}, 1.5},
		{[]float64{0, 0}, 0},
	} {
		if got := Imbalance(tc.xs); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("Imbalance(%v) = %v, want %v", tc.xs, got, tc.want)
		}
	}
}

func TestCollectorResult(t *testing.T) {
	var c collector
	c.promptTokens, c.matchedTokens = 1000, 250
	c.ttft = []float64{0.3, 0.1, 0.2, 0.4}
	c.e2e = []float64{1, 3}
	c.estimate(16, 16)
	c.estimate(32, 0)
	c.estimate(0, 16)
	c.estimate(48, 48)
	r := c.result("x", []float64{2, 2, 4}, []float64{1, 3})
	want := Result{Name: "x", HitRatio: 0.25, TTFTMean: 0.25, TTFTP50: 0.2, TTFTP99: 0.4, E2EMean: 2,
		ImbalancePrefill: 1.5, ImbalanceInFlight: 1.5, EstimateExactShare: 0.5, EstimateMAETokens: 12}
	r.TTFTs, r.Served = nil, 0
	if math.Abs(r.TTFTMean-want.TTFTMean) > 1e-12 {
		t.Fatalf("mean %v", r.TTFTMean)
	}
	r.TTFTMean = want.TTFTMean
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("result\n got %+v\nwant %+v", r, want)
	}
}
