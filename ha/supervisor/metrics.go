package supervisor

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/crescent-kv/crescent/ha"
)

var (
	descRole = prometheus.NewDesc("crescent_ha_role",
		"1 for the role this master is in (standby, candidate, warmup, leader), 0 for the others", []string{"role"}, nil)
	descTerm = prometheus.NewDesc("crescent_ha_term",
		"term (view version) held while candidate, in warm-up or leader; 0 in standby", nil, nil)
	descElections = prometheus.NewDesc("crescent_ha_elections_total",
		"elections this master won", nil, nil)
	descTimeToServe = prometheus.NewDesc("crescent_ha_time_to_serve_seconds",
		"seconds from the last acquisition to serving (claim, final catch-up and warm-up)", nil, nil)
)

// Collector exports the supervisor's metrics and, while it follows the
// log, its follower's (crescent_ha_follower_*).
func (s *Supervisor) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Supervisor }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRole, descTerm, descElections, descTimeToServe} {
		ch <- d
	}
	(*ha.Follower)(nil).Collector().Describe(ch) // the descriptors only
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	role := Role(s.role.Load())
	for r := Standby; r <= Leader; r++ {
		v := 0.0
		if r == role {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descRole, prometheus.GaugeValue, v, r.String())
	}
	ch <- prometheus.MustNewConstMetric(descTerm, prometheus.GaugeValue, float64(s.term.Load()))
	ch <- prometheus.MustNewConstMetric(descElections, prometheus.CounterValue, float64(s.elections.Load()))
	ch <- prometheus.MustNewConstMetric(descTimeToServe, prometheus.GaugeValue, time.Duration(s.timeToServ.Load()).Seconds())
	s.mu.Lock()
	f := s.fol
	s.mu.Unlock()
	if f != nil {
		f.Collector().Collect(ch)
	}
}
