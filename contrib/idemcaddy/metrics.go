package idemcaddy

import (
	"errors"
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemkit/idem/contrib/idemprom"
)

// metrics are idem's metrics (contrib/idemprom), as idem proxy serves them,
// shared by every handler of every configuration: their counts go on
// across reloads. Each configuration registers them in its metrics
// registry, which Caddy's admin endpoint serves at /metrics.
var metrics = idemprom.New()

// registerMetrics registers metrics in the registry of ctx's
// configuration, once: the other handlers of a configuration find them
// there.
func registerMetrics(ctx caddy.Context) error {
	reg := ctx.GetMetricsRegistry()
	if reg == nil {
		return nil
	}
	err := reg.Register(metrics)
	var are prometheus.AlreadyRegisteredError
	if err == nil || errors.As(err, &are) && are.ExistingCollector == prometheus.Collector(metrics) {
		return nil
	}
	return fmt.Errorf("idempotency: metrics: %w", err)
}
