// The real node's cluster DNS: CoreDNS built with only the plugins the local cluster uses (main.go).
// A module of its own, like kwok and helm: the replace directives pin every module it shares with ../kube
// to kube's version (written by ../align.sh). After changing the pinned version, rerun ../align.sh.
module epd-operator/tools/k8s/coredns

go 1.26.0

require github.com/coredns/coredns v1.15.0

require (
	github.com/apparentlymart/go-cidr v1.1.1 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/coredns/caddy v1.1.4 // indirect
	github.com/coreos/go-systemd/v22 v22.7.0 // indirect
	github.com/davecgh/go-spew v1.1.2-0.20180830191138-d8f796af33cc // indirect
	github.com/emicklei/go-restful/v3 v3.13.0 // indirect
	github.com/flynn/go-shlex v0.0.0-20150515145356-3f9db97f8568 // indirect
	github.com/fxamacker/cbor/v2 v2.9.1 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-openapi/jsonpointer v1.0.0 // indirect
	github.com/go-openapi/jsonreference v1.0.0 // indirect
	github.com/go-openapi/swag v0.27.1 // indirect
	github.com/golang-jwt/jwt/v5 v5.3.1 // indirect
	github.com/google/gnostic-models v0.7.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/grpc-ecosystem/grpc-opentracing v0.0.0-20180507213350-8e809c8a8645 // indirect
	github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect
	github.com/josharian/intern v1.0.0 // indirect
	github.com/jpillora/backoff v1.0.0 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/mailru/easyjson v0.7.7 // indirect
	github.com/mdlayher/socket v0.6.0 // indirect
	github.com/mdlayher/vsock v1.3.0 // indirect
	github.com/miekg/dns v1.1.73 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.3-0.20250322232337-35a7c28c31ee // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/mwitkow/go-conntrack v0.0.0-20190716064945-2f068394615f // indirect
	github.com/opentracing/opentracing-go v1.2.0 // indirect
	github.com/pires/go-proxyproto v0.15.0 // indirect
	github.com/pmezard/go-difflib v1.0.1-0.20181226105442-5d4384ee4fb2 // indirect
	github.com/prometheus/client_golang v1.24.1 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/exporter-toolkit v0.20.0 // indirect
	github.com/prometheus/procfs v0.21.1 // indirect
	github.com/quic-go/qpack v0.6.0 // indirect
	github.com/quic-go/quic-go v0.64.1 // indirect
	github.com/spf13/pflag v1.0.10 // indirect
	github.com/x448/float16 v0.8.4 // indirect
	go.uber.org/automaxprocs v1.6.0 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/oauth2 v0.37.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/term v0.46.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260928230214-8a89bd6388cc // indirect
	google.golang.org/grpc v1.84.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
	gopkg.in/evanphx/json-patch.v4 v4.13.0 // indirect
	gopkg.in/inf.v0 v0.9.1 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
	k8s.io/api v0.37.1 // indirect
	k8s.io/apimachinery v0.37.1 // indirect
	k8s.io/client-go v0.37.1 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
	k8s.io/kube-openapi v0.0.0-20260721132016-d427ff9ee9ad // indirect
	k8s.io/utils v0.0.0-20260626114624-be93311217bd // indirect
	sigs.k8s.io/json v0.0.0-20250730193827-2d320260d730 // indirect
	sigs.k8s.io/mcs-api v0.5.2 // indirect
	sigs.k8s.io/randfill v1.0.0 // indirect
	sigs.k8s.io/structured-merge-diff/v6 v6.4.2 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)

replace cel.dev/expr => cel.dev/expr v0.25.1

replace cloud.google.com/go/compute/metadata => cloud.google.com/go/compute/metadata v0.9.0

replace github.com/GoogleCloudPlatform/opentelemetry-operations-go/detectors/gcp => github.com/GoogleCloudPlatform/opentelemetry-operations-go/detectors/gcp v1.30.0

replace github.com/aws/aws-sdk-go-v2 => github.com/aws/aws-sdk-go-v2 v1.36.3

replace github.com/aws/aws-sdk-go-v2/config => github.com/aws/aws-sdk-go-v2/config v1.29.14

replace github.com/aws/aws-sdk-go-v2/credentials => github.com/aws/aws-sdk-go-v2/credentials v1.17.67

replace github.com/aws/aws-sdk-go-v2/feature/ec2/imds => github.com/aws/aws-sdk-go-v2/feature/ec2/imds v1.16.30

replace github.com/aws/aws-sdk-go-v2/internal/configsources => github.com/aws/aws-sdk-go-v2/internal/configsources v1.3.34

replace github.com/aws/aws-sdk-go-v2/internal/endpoints/v2 => github.com/aws/aws-sdk-go-v2/internal/endpoints/v2 v2.6.34

replace github.com/aws/aws-sdk-go-v2/service/internal/accept-encoding => github.com/aws/aws-sdk-go-v2/service/internal/accept-encoding v1.12.3

replace github.com/aws/aws-sdk-go-v2/service/internal/presigned-url => github.com/aws/aws-sdk-go-v2/service/internal/presigned-url v1.12.15

replace github.com/aws/aws-sdk-go-v2/service/sso => github.com/aws/aws-sdk-go-v2/service/sso v1.25.3

replace github.com/aws/aws-sdk-go-v2/service/ssooidc => github.com/aws/aws-sdk-go-v2/service/ssooidc v1.30.1

replace github.com/aws/aws-sdk-go-v2/service/sts => github.com/aws/aws-sdk-go-v2/service/sts v1.33.19

replace github.com/aws/smithy-go => github.com/aws/smithy-go v1.22.3

replace github.com/cncf/xds/go => github.com/cncf/xds/go v0.0.0-20251210132809-ee656c7534f5

replace github.com/coredns/caddy => github.com/coredns/caddy v1.1.1

replace github.com/envoyproxy/go-control-plane/envoy => github.com/envoyproxy/go-control-plane/envoy v1.36.0

replace github.com/envoyproxy/protoc-gen-validate => github.com/envoyproxy/protoc-gen-validate v1.3.0

replace github.com/felixge/httpsnoop => github.com/felixge/httpsnoop v1.0.4

replace github.com/fxamacker/cbor/v2 => github.com/fxamacker/cbor/v2 v2.9.0

replace github.com/go-jose/go-jose/v4 => github.com/go-jose/go-jose/v4 v4.1.3

replace github.com/go-logr/logr => github.com/go-logr/logr v1.4.3

replace github.com/go-openapi/jsonpointer => github.com/go-openapi/jsonpointer v0.21.0

replace github.com/go-openapi/jsonreference => github.com/go-openapi/jsonreference v0.20.2

replace github.com/go-openapi/swag => github.com/go-openapi/swag v0.23.0

replace github.com/godbus/dbus/v5 => github.com/godbus/dbus/v5 v5.2.2

replace github.com/golang-jwt/jwt/v5 => github.com/golang-jwt/jwt/v5 v5.3.0

replace github.com/google/gofuzz => github.com/google/gofuzz v1.0.0

replace github.com/grpc-ecosystem/grpc-gateway/v2 => github.com/grpc-ecosystem/grpc-gateway/v2 v2.27.7

replace github.com/klauspost/compress => github.com/klauspost/compress v1.18.0

replace github.com/opentracing/opentracing-go => github.com/opentracing/opentracing-go v1.1.0

replace github.com/pkg/errors => github.com/pkg/errors v0.8.1

replace github.com/prometheus/client_golang => github.com/prometheus/client_golang v1.23.2

replace github.com/prometheus/client_model => github.com/prometheus/client_model v0.6.2

replace github.com/prometheus/common => github.com/prometheus/common v0.67.5

replace github.com/prometheus/procfs => github.com/prometheus/procfs v0.19.2

replace github.com/spf13/pflag => github.com/spf13/pflag v1.0.9

replace github.com/spiffe/go-spiffe/v2 => github.com/spiffe/go-spiffe/v2 v2.6.0

replace github.com/stretchr/objx => github.com/stretchr/objx v0.5.2

replace github.com/stretchr/testify => github.com/stretchr/testify v1.11.1

replace go.etcd.io/bbolt => go.etcd.io/bbolt v1.4.3

replace go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 v3.6.8

replace go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 v3.6.8

replace go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 v3.6.8

replace go.opentelemetry.io/contrib/detectors/gcp => go.opentelemetry.io/contrib/detectors/gcp v1.39.0

replace go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp => go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp v0.65.0

replace go.opentelemetry.io/otel => go.opentelemetry.io/otel v1.41.0

replace go.opentelemetry.io/otel/metric => go.opentelemetry.io/otel/metric v1.41.0

replace go.opentelemetry.io/otel/sdk => go.opentelemetry.io/otel/sdk v1.40.0

replace go.opentelemetry.io/otel/sdk/metric => go.opentelemetry.io/otel/sdk/metric v1.40.0

replace go.opentelemetry.io/otel/trace => go.opentelemetry.io/otel/trace v1.41.0

replace go.opentelemetry.io/proto/otlp => go.opentelemetry.io/proto/otlp v1.9.0

replace go.uber.org/atomic => go.uber.org/atomic v1.4.0

replace go.uber.org/zap => go.uber.org/zap v1.27.1

replace go.yaml.in/yaml/v2 => go.yaml.in/yaml/v2 v2.4.3

replace go.yaml.in/yaml/v3 => go.yaml.in/yaml/v3 v3.0.4

replace golang.org/x/crypto => golang.org/x/crypto v0.47.0

replace golang.org/x/exp => golang.org/x/exp v0.0.0-20251219203646-944ab1f22d93

replace golang.org/x/mod => golang.org/x/mod v0.32.0

replace golang.org/x/net => golang.org/x/net v0.49.0

replace golang.org/x/oauth2 => golang.org/x/oauth2 v0.34.0

replace golang.org/x/sync => golang.org/x/sync v0.19.0

replace golang.org/x/sys => golang.org/x/sys v0.40.0

replace golang.org/x/term => golang.org/x/term v0.39.0

replace golang.org/x/text => golang.org/x/text v0.33.0

replace golang.org/x/time => golang.org/x/time v0.14.0

replace golang.org/x/tools => golang.org/x/tools v0.41.0

replace golang.org/x/tools/go/expect => golang.org/x/tools/go/expect v0.1.1-deprecated

replace golang.org/x/xerrors => golang.org/x/xerrors v0.0.0-20200804184101-5ec99f83aff1

replace gonum.org/v1/gonum => gonum.org/v1/gonum v0.16.0

replace google.golang.org/genproto/googleapis/api => google.golang.org/genproto/googleapis/api v0.0.0-20260128011058-8636f8732409

replace google.golang.org/genproto/googleapis/rpc => google.golang.org/genproto/googleapis/rpc v0.0.0-20260128011058-8636f8732409

replace google.golang.org/grpc => google.golang.org/grpc v1.79.3

replace google.golang.org/protobuf => google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af

replace k8s.io/api => k8s.io/api v0.36.3

replace k8s.io/apimachinery => k8s.io/apimachinery v0.36.3

replace k8s.io/client-go => k8s.io/client-go v0.36.3

replace k8s.io/kube-openapi => k8s.io/kube-openapi v0.0.0-20260317180543-43fb72c5454a

replace k8s.io/streaming => k8s.io/streaming v0.36.3

replace k8s.io/utils => k8s.io/utils v0.0.0-20260210185600-b8788abfbbc2

replace sigs.k8s.io/structured-merge-diff/v6 => sigs.k8s.io/structured-merge-diff/v6 v6.3.3
