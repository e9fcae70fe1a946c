// Command coredns is the real node's cluster DNS: CoreDNS with only the plugins the local cluster's Corefile
// uses (see epd_testenv/node_configs.py). The stock main links every plugin, cloud DNS providers included;
// these few answer Service and pod names from the API and nothing else (no forward: no query leaves the host).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// directives is the upstream plugin order (core/dnsserver/zdirectives.go) cut to the plugins linked above.
var directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes"}

func main() {
	dnsserver.Directives = directives
	coremain.Run()
}
