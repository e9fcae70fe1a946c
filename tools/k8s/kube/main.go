// Command kube is one binary holding the pinned control plane and node: kube-apiserver, kube-controller-manager,
// kube-scheduler, kubectl, etcd, and the real node's kubelet and kube-proxy. It dispatches on the name it was started under (argv[0]), so the build
// script makes one symlink per tool. One binary links once instead of five times and takes less than half
// the disk of separate ones (see ../README.md for the figures).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	_ "time/tzdata" // CronJob time zones, as in the upstream mains

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as in the upstream mains
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as in the upstream mains
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as in the upstream mains
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kubeproxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

// tools maps each name the binary answers to onto the upstream main it stands for.
var tools = map[string]func() int{
	"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
	"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubectl":                 runKubectl,
	"kubelet":                 func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"kube-proxy":              func() int { return cli.Run(kubeproxy.NewProxyCommand()) },
	"etcd":                    runEtcd,
}

func runKubectl() int {
	// As upstream: read -v before the command is built, so klog is set while plugins and .kuberc load.
	_, _ = logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args))
	if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}

func runEtcd() int {
	// etcdmain.Main serves until the process is signalled and exits by itself on errors.
	etcdmain.Main(os.Args)
	return 0
}

func main() {
	name := filepath.Base(os.Args[0])
	// `kube TOOL args...` works too, for a quick try without the symlinks.
	if _, ok := tools[name]; !ok && len(os.Args) > 1 {
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	run, ok := tools[name]
	if !ok {
		names := make([]string, 0, len(tools))
		for n := range tools {
			names = append(names, n)
		}
		fmt.Fprintf(os.Stderr, "kube: start me as one of %s (a symlink), or as `kube TOOL ...`\n",
			strings.Join(names, ", "))
		os.Exit(2)
	}
	os.Exit(run())
}
