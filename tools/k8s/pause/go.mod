// The real node's pod sandbox binary (main.go), standard library only.
module epd-operator/tools/k8s/pause

go 1.26.0
