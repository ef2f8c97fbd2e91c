#!/usr/bin/env bash
# Assembles the Android library and the desktop JVM jar from the Maven build.
#
#   bash bindings/android/build-aar.sh --abi arm64-v8a=PATH/libeventspool_ffi.so [--abi x86_64=PATH ...]
#   bash bindings/android/build-aar.sh --host-test        # CI: layout check with the host library
#
# Outputs, in --out DIR (default bindings/android/target/dist):
#   eventspool-android.aar   classes.jar (the Kotlin layer, the generated bindings, the Android
#                            integration), AndroidManifest.xml, proguard.txt (consumer rules),
#                            R.txt, jni/<abi>/libeventspool_ffi.so for each --abi given
#   eventspool-android.pom   its dependencies (JNA as an aar on Android, OkHttp, coroutines,
#                            kotlinx-serialization-json)
#   eventspool-jvm.jar       the Kotlin layer + generated bindings + the host library at JNA's
#                            resource path (<os>-<arch>/), for desktop apps and JVM unit tests
#
# The Android libraries come from a release job with the Android NDK (docs/bindings.md
# §Android and iOS builds):
# this machine cannot link for bionic. --abi refuses a library linked against glibc (the host's);
# --host-test packs the host library under jni/x86_64/ all the same, to check the layout, and
# names the file eventspool-android-host-test.aar so it is never mistaken for a release. Every
# --abi library must be aligned for 16 KB pages (check-page-alignment.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."

out=bindings/android/target/dist
abis=()
host_test=0
compile=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --abi) abis+=("$2"); shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --host-test) host_test=1; shift ;;
        --no-compile) compile=0; shift ;; # the classes are fresh already (CI, right after mvn test)
        *) echo "build-aar.sh: unknown argument '$1' (known: --abi ABI=PATH, --out DIR, --host-test, --no-compile)" >&2; exit 2 ;;
    esac
done

case "$(uname -s)" in
    Darwin) host_lib=bindings/native/libeventspool_ffi.dylib; jna_os=darwin ;;
    *) host_lib=bindings/native/libeventspool_ffi.so; jna_os=linux ;;
esac
case "$(uname -m)" in
    x86_64|amd64) jna_arch=x86-64 ;;
    aarch64|arm64) jna_arch=aarch64 ;;
    *) jna_arch="$(uname -m)" ;;
esac
if [[ $host_test -eq 1 ]]; then
    abis+=("x86_64=$host_lib")
fi
if [[ ${#abis[@]} -eq 0 ]]; then
    echo "build-aar.sh: no --abi given (an aar without native libraries cannot run)" >&2
    exit 2
fi

# The classes: compiled by the Maven reactor (the generated bindings must exist: generate.sh).
[[ $compile -eq 0 ]] || mvn -B -q -f bindings/pom.xml compile >&2
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/aar" "$work/classes" "$work/jvm" "$out"
# Absolute from here on: the zip step runs inside the staging directory.
out="$(cd "$out" && pwd)"
cp -R bindings/kotlin/target/classes/. "$work/classes/"
cp -R bindings/android/target/classes/. "$work/classes/"
jar --create --file "$work/aar/classes.jar" -C "$work/classes" .
cp bindings/android/src/main/android/AndroidManifest.xml "$work/aar/"
cp bindings/android/src/main/android/proguard.txt "$work/aar/"
: > "$work/aar/R.txt"

for pair in "${abis[@]}"; do
    abi="${pair%%=*}"
    lib="${pair#*=}"
    case "$abi" in
        arm64-v8a|armeabi-v7a|x86|x86_64) ;;
        *) echo "build-aar.sh: '$abi' is not an Android ABI (arm64-v8a, armeabi-v7a, x86, x86_64)" >&2; exit 2 ;;
    esac
    [[ -f "$lib" ]] || { echo "build-aar.sh: --abi $abi: no file '$lib'" >&2; exit 2; }
    if [[ $host_test -eq 0 ]] && grep -q 'NEEDED.*\[libc\.so\.6\]' <<<"$(readelf -d "$lib" 2>/dev/null)"; then
        echo "build-aar.sh: --abi $abi: '$lib' links glibc's libc.so.6: a host build, not an Android (bionic) one" >&2
        exit 2
    fi
    # Google Play requires 16 KB page alignment (check-page-alignment.sh says why); the host
    # library of --host-test is a 4 KB-aligned glibc build and is only reported.
    if ! bash bindings/android/check-page-alignment.sh "$lib"; then
        if [[ $host_test -eq 0 ]]; then
            echo "build-aar.sh: --abi $abi: '$lib' is not aligned for 16 KB pages (docs/bindings.md §Android and iOS builds: the NDK command)" >&2
            exit 2
        fi
        echo "build-aar.sh: (--host-test: the host library is packed all the same, to check the layout)" >&2
    fi
    mkdir -p "$work/aar/jni/$abi"
    cp "$lib" "$work/aar/jni/$abi/libeventspool_ffi.so"
    # A debug build carries ~100 MB of debug info; a release build is stripped already.
    strip --strip-debug "$work/aar/jni/$abi/libeventspool_ffi.so" 2>/dev/null || true
done

name=eventspool-android.aar
[[ $host_test -eq 1 ]] && name=eventspool-android-host-test.aar
rm -f "$out/$name"
(cd "$work/aar" && zip -q -r -X "$out/$name" .)

# The desktop jar: the JVM classes only (no android.*), the host library where JNA looks on the classpath.
cp -R bindings/kotlin/target/classes/. "$work/jvm/"
mkdir -p "$work/jvm/$jna_os-$jna_arch"
cp "$host_lib" "$work/jvm/$jna_os-$jna_arch/"
strip --strip-debug "$work/jvm/$jna_os-$jna_arch/$(basename "$host_lib")" 2>/dev/null || true
jar --create --file "$out/eventspool-jvm.jar" -C "$work/jvm" .

cat > "$out/eventspool-android.pom" <<POM
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.eventspool</groupId>
  <artifactId>eventspool-android</artifactId>
  <version>0.1.0</version>
  <packaging>aar</packaging>
  <dependencies>
    <dependency><groupId>net.java.dev.jna</groupId><artifactId>jna</artifactId><version>5.19.1</version><type>aar</type></dependency>
    <dependency><groupId>com.squareup.okhttp3</groupId><artifactId>okhttp</artifactId><version>5.5.1</version></dependency>
    <dependency><groupId>org.jetbrains.kotlinx</groupId><artifactId>kotlinx-coroutines-core</artifactId><version>1.11.0</version></dependency>
    <dependency><groupId>org.jetbrains.kotlinx</groupId><artifactId>kotlinx-serialization-json</artifactId><version>1.12.0</version></dependency>
  </dependencies>
</project>
POM
# The layout an Android build reads: fail here rather than in the app's build.
entries="$(unzip -Z1 "$out/$name")"
for want in classes.jar AndroidManifest.xml proguard.txt R.txt; do
    grep -qx "$want" <<<"$entries" || { echo "build-aar.sh: $name lacks $want" >&2; exit 1; }
done
for pair in "${abis[@]}"; do
    grep -qx "jni/${pair%%=*}/libeventspool_ffi.so" <<<"$entries" \
        || { echo "build-aar.sh: $name lacks jni/${pair%%=*}/libeventspool_ffi.so" >&2; exit 1; }
done
# Listings are read whole before grep looks at them: `unzip | grep -q` under pipefail fails
# whenever grep quits at its first match while unzip is still writing (SIGPIPE).
unzip -p "$out/$name" classes.jar > "$work/check.jar"
classes="$(unzip -Z1 "$work/check.jar")"
for class in dev/eventspool/android/DeliveryJobService.class dev/eventspool/Spool.class uniffi/eventspool/EventSpool.class; do
    grep -qx "$class" <<<"$classes" \
        || { echo "build-aar.sh: classes.jar lacks $class" >&2; exit 1; }
done
jvm_entries="$(unzip -Z1 "$out/eventspool-jvm.jar")"
grep -qx "$jna_os-$jna_arch/$(basename "$host_lib")" <<<"$jvm_entries" \
    || { echo "build-aar.sh: eventspool-jvm.jar lacks the host library" >&2; exit 1; }
echo "built $out/$name ($(IFS=,; echo "${abis[*]%%=*}")) and $out/eventspool-jvm.jar" >&2
