# Shared setup steps for bin/demo and bin/test. Sourced, not run.

PYTHON_BIN=${PYTHON_BIN:-$(command -v python3.11 || command -v python3)}

# ensure_venv EXTRAS: create .venv and install the project (with EXTRAS such as "[dev]") unless
# the same pyproject.toml was already installed with those extras.
ensure_venv() {
  local extras=$1
  if [ ! -x .venv/bin/python ]; then
    echo "[setup 1/3] creating .venv with $PYTHON_BIN"
    "$PYTHON_BIN" -m venv .venv
  else
    echo "[setup 1/3] .venv exists"
  fi
  local stamp=".venv/.installed${extras}"
  local digest
  digest=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
    echo "[setup 2/3] dependencies up to date"
  else
    echo "[setup 2/3] installing dependencies${extras} (first time: several minutes, PySpark is ~450 MB)"
    .venv/bin/python -m pip install --upgrade --quiet pip
    .venv/bin/python -m pip install --progress-bar on -e ".${extras}"
    echo "$digest" > "$stamp"
  fi
  echo "[setup 3/3] Java: $(java -version 2>&1 | head -n 1 || echo 'not found: install Java 17 (openjdk-17-jre-headless)')"
}

# ensure_kafka_jars: Apache Kafka's broker (org.apache.kafka:kafka_2.13 and its runtime jars),
# fetched once from Maven Central with Maven (progress shown) into var/kafka/<version>/ with its
# class-data archive; later runs find them cached. Backstop starts that broker where no
# KAFKA_BOOTSTRAP_SERVERS is given: the tests' private brokers, the demo's (docs/KAFKA.md).
ensure_kafka_jars() {
  if ! command -v mvn >/dev/null 2>&1 \
    && ! .venv/bin/python -c 'import sys; from infra.kafka import cached_jars; sys.exit(cached_jars() is None)'; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "[setup] installing Debian's maven to fetch the Kafka broker's jars"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven >/dev/null
    else
      echo "[setup] Maven (mvn) is needed once to fetch the Kafka broker's jars: apt-get install maven"
    fi
  fi
  echo "[setup] Kafka broker (Apache Kafka from Maven Central, cached in var/kafka/)"
  .venv/bin/python -m infra.kafka fetch
}

# ensure_chromium: the browser tests drive Debian's chromium; install it when missing and we may.
ensure_chromium() {
  if command -v chromium >/dev/null 2>&1; then
    return
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Debian's chromium for the browser tests"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "[setup] chromium not found: browser tests will be skipped (apt-get install chromium)"
  fi
}
