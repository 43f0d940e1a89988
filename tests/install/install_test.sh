#!/usr/bin/env bash
# `cmake --install` and `cpack` checked as a user meets them:
# - the tree installed into a temporary prefix, then moved elsewhere: its bin/vlm, run from
#   another folder with no -m, answers with the model it finds beside itself (share/vlm/models),
#   exactly as the build's vlm does; with that folder gone, the error names where it looked;
# - the installed `vlm tune` runs the tuner installed beside it (share/vlm/scripts);
# - a program built against the installed package (find_package(vlm), vlm::vlm: the checkout's
#   examples/ask.cc) answers as the build's own vlm_example_ask;
# - the Debian package's control fields (dpkg-deb -I: its Depends, from dpkg-shlibdeps, name the
#   shared libraries vlm links) and contents (dpkg-deb -c: binary, model, headers, CMake package).
# Usage: install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

cmake --install "$build" --prefix "$tmp/first" > /dev/null
mv "$tmp/first" "$tmp/moved"  # the prefix is relocatable
mkdir "$tmp/elsewhere"
cd "$tmp/elsewhere"
args=(run -p "Describe the image." --image "$src/examples/shapes.png" --greedy -n 24 -t 2)
want=$("$build/tools/cli/vlm" "${args[@]}" 2> /dev/null)
got=$("$tmp/moved/bin/vlm" "${args[@]}" 2> /dev/null) || fail "the installed vlm run failed"
[ -n "$want" ] && [ "$got" = "$want" ] || fail "installed vlm said '$got', the build's '$want'"
mv "$tmp/moved/share/vlm/models" "$tmp/models-away"
if out=$("$tmp/moved/bin/vlm" "${args[@]}" 2>&1); then fail "ran without its model"; fi
grep -qF "$tmp/moved/share/vlm/models/tiny-qwen35" <<< "$out" || fail "the error does not name where it looked: $out"
mv "$tmp/models-away" "$tmp/moved/share/vlm/models"
echo "ok: installed, moved, run from elsewhere with the model beside it"

# `vlm tune` runs the tuner installed beside it: its help (a Python with the bench packages) or,
# with a bare python3, the tuner's own error naming the installed requirements file.
for f in scripts/tune_serve.py scripts/bench_serve.py scripts/requirements-bench.txt \
  images/cat_chelsea.png; do
  [ -f "$tmp/moved/share/vlm/$f" ] || fail "share/vlm/$f is not installed"
done
out=$(VLM_PYTHON=python3 "$tmp/moved/bin/vlm" tune --help 2>&1) || true
grep -qF -e "--slo-itl" <<< "$out" ||
  grep -qF "$tmp/moved/share/vlm/scripts/requirements-bench.txt" <<< "$out" ||
  fail "the installed vlm tune did not run the installed tuner: $out"
echo "ok: the installed vlm tune runs the tuner beside it"

cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/moved" -DVLM_EXAMPLES="$src/examples" > "$tmp/consumer.log" 2>&1 ||
  { cat "$tmp/consumer.log"; fail "find_package(vlm) failed"; }
cmake --build "$tmp/consumer" > "$tmp/consumer-build.log" 2>&1 ||
  { tail -30 "$tmp/consumer-build.log"; fail "the program against vlm::vlm did not build"; }
model="$tmp/moved/share/vlm/models/tiny-qwen35"
want=$("$build/examples/vlm_example_ask" "$model" "$src/examples/shapes.png" "Describe the image." 2> /dev/null)
got=$("$tmp/consumer/vlm_consumer_ask" "$model" "$src/examples/shapes.png" "Describe the image." 2> /dev/null)
[ -n "$want" ] && [ "$got" = "$want" ] || fail "the consumer said '$got', vlm_example_ask '$want'"
echo "ok: a program built with find_package(vlm) answers as vlm_example_ask"

(cd "$build" && cpack -G DEB -B "$tmp/deb" > "$tmp/cpack.log" 2>&1) || { tail -30 "$tmp/cpack.log"; fail "cpack"; }
deb=$(ls "$tmp"/deb/*.deb)
info=$(dpkg-deb -I "$deb")
grep -q "^ Package: vlm$" <<< "$info" || fail "no Package: vlm in $info"
depends=$(grep "^ Depends:" <<< "$info") || fail "no Depends in $info"
for lib in libc6 libcurl4 libavcodec libnettle libzmq5 libturbojpeg0; do
  grep -q "$lib" <<< "$depends" || fail "Depends lacks $lib: $depends"
done
contents=$(dpkg-deb -c "$deb")
for f in ./usr/bin/vlm ./usr/share/vlm/models/tiny-qwen35/config.json \
         ./usr/share/vlm/models/tiny-qwen35/model.safetensors ./usr/include/vlm/engine.h \
         ./usr/include/vlm/hub.h; do
  grep -qF " $f" <<< "$contents" || fail "the package lacks $f"
done
grep -qE " \./usr/lib/.*cmake/vlm/vlmConfig\.cmake$" <<< "$contents" || fail "no vlmConfig.cmake"
grep -qE " \./usr/lib/.*vlm/libvlm_engine\.a$" <<< "$contents" || fail "no libvlm_engine.a"
echo "ok: $(basename "$deb"): $depends"
