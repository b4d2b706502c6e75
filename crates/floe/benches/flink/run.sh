#!/usr/bin/env bash
# Runs an Apache Flink baseline of Floe's benchmarks until killed:
#   run.sh BROKERS TOPIC CATALOG_URI TABLE                     the OTLP job (benches/otlp.rs)
#   run.sh --rollup BROKERS TOPIC CATALOG_URI TABLE GROUP      the windows rollup (benches/windows.rs)
# Builds the jar first when it is missing or older than pom.xml or a source file;
# `run.sh --build` only does that, so a harness can keep the build out of its timing.
# Everything it prints goes to stderr.
set -euo pipefail

build_only=0
main=floe.bench.FlinkOtlpBench
if [ "$#" -eq 1 ] && [ "$1" = "--build" ]; then
  build_only=1
elif [ "$#" -eq 6 ] && [ "$1" = "--rollup" ]; then
  main=floe.bench.FlinkRollupBench
  shift
elif [ "$#" -ne 4 ]; then
  echo "usage: $0 BROKERS TOPIC CATALOG_URI TABLE | $0 --rollup BROKERS TOPIC CATALOG_URI TABLE GROUP | $0 --build" >&2
  exit 2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
jar="$here/target/floe-flink-bench.jar"

stale=0
if [ ! -f "$jar" ] || [ ! -d "$here/target/lib" ]; then
  stale=1
elif [ -n "$(find "$here/pom.xml" "$here/src" -type f -newer "$jar" -print -quit)" ]; then
  stale=1
fi
if [ "$stale" = 1 ]; then
  echo "flink-otlp-bench: building $jar" >&2
  rm -rf "$here/target/lib"
  log="$(mktemp)"
  if ! (cd "$here" && mvn -B -q -T 1 -DskipTests package) >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "flink-otlp-bench: mvn package failed" >&2
    exit 1
  fi
  rm -f "$log"
fi
if [ "$build_only" = 1 ]; then
  exit 0
fi

# Flink 1.20 on Java 17 reflects into these JDK packages (Kryo, its closure cleaner, Netty).
java_opens=(
  --add-exports=java.base/sun.net.util=ALL-UNNAMED
  --add-exports=java.rmi/sun.rmi.registry=ALL-UNNAMED
  --add-exports=java.security.jgss/sun.security.krb5=ALL-UNNAMED
  --add-opens=java.base/java.lang=ALL-UNNAMED
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED
  --add-opens=java.base/java.net=ALL-UNNAMED
  --add-opens=java.base/java.io=ALL-UNNAMED
  --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens=java.base/java.text=ALL-UNNAMED
  --add-opens=java.base/java.time=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.locks=ALL-UNNAMED
)

exec java "${java_opens[@]}" -Xmx1g ${FLOE_FLINK_JAVA_OPTS:-} \
  -cp "$jar:$here/target/lib/*" "$main" "$@" 1>&2
