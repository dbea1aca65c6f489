package event

import "github.com/prometheus/client_golang/prometheus"

var (
	descBatches = prometheus.NewDesc("crescent_kv_events_published_batches_total",
		"Event batches published (one sequence number each).", nil, nil)
	descEvents = prometheus.NewDesc("crescent_kv_events_published_events_total",
		"Events published.", nil, nil)
	descDropped = prometheus.NewDesc("crescent_kv_events_dropped_events_total",
		"Events dropped by the drop-oldest overflow policy.", nil, nil)
	descSkipped = prometheus.NewDesc("crescent_kv_events_skipped_seqs_total",
		"Sequence numbers skipped to mark dropped events.", nil, nil)
	descSubDrops = prometheus.NewDesc("crescent_kv_events_subscriber_dropped_batches_total",
		"Batches not delivered to a subscriber whose queue was full.", nil, nil)
	descReplays = prometheus.NewDesc("crescent_kv_events_replay_requests_total",
		"Replay requests served.", nil, nil)
	descDepth = prometheus.NewDesc("crescent_kv_events_queue_depth",
		"Events waiting in the publisher queue.", nil, nil)
	descCapacity = prometheus.NewDesc("crescent_kv_events_queue_capacity",
		"Capacity of the publisher queue in events.", nil, nil)
	descSubscribers = prometheus.NewDesc("crescent_kv_events_subscribers",
		"Connected peers with at least one subscription.", nil, nil)
)

type collector struct{ p *Publisher }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBatches, descEvents, descDropped, descSkipped,
		descSubDrops, descReplays, descDepth, descCapacity, descSubscribers} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.p.Stats()
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge := func(d *prometheus.Desc, v int) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter(descBatches, s.PublishedBatches)
	counter(descEvents, s.PublishedEvents)
	counter(descDropped, s.DroppedEvents)
	counter(descSkipped, s.SkippedSeqs)
	counter(descSubDrops, s.SubscriberDrops)
	counter(descReplays, s.ReplayRequests)
	gauge(descDepth, s.QueueDepth)
	gauge(descCapacity, s.QueueCapacity)
	gauge(descSubscribers, s.Subscribers)
}
