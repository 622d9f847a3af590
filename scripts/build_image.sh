#!/usr/bin/env bash
# Builds the image of the services (deploy/docker/Dockerfile) with podman on this machine and
# tags it $IMAGE_REPOSITORY:VERSION (default exactly:VERSION, as the Helm chart names it),
# VERSION being pyproject.toml's [project] version; prints the tag, and the image id to
# $IMAGE_ID_FILE when set. `make image` runs it.
#
# IMAGE_BASE chooses the Dockerfile's BASE:
#   debian-local (default)  localhost/exactly-base:bookworm, a Debian bookworm (Python 3.11)
#                           made here with debootstrap from the mirror apt uses: the usual
#                           base images are on registries a build machine may not reach.
#                           Made once: kept in podman's storage and as a tarball under
#                           .run/image/, so later builds start from it at once.
#   any other value         an image to use as it is or pull, e.g. python:3.11-slim.
# Podman keeps the layers in its storage: a build whose sources did not change takes
# seconds, one whose sources changed reinstalls the project only (the dependencies are a
# layer of their own). Installs podman and runc (scripts/podman.sh), and debootstrap for
# debian-local, with apt-get when missing. Needs root (rootful podman).
set -euo pipefail
cd "$(dirname "$0")/.."

repository=${IMAGE_REPOSITORY:-exactly}
base_choice=${IMAGE_BASE:-debian-local}
suite=bookworm
local_base=localhost/exactly-base:$suite
cache=.run/image

need_apt=()
command -v podman >/dev/null 2>&1 || need_apt+=(podman)
command -v runc >/dev/null 2>&1 || need_apt+=(runc)
if [ "$base_choice" = debian-local ]; then
  command -v debootstrap >/dev/null 2>&1 || need_apt+=(debootstrap)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "image: installing ${need_apt[*]} with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${need_apt[@]}"
fi

version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')

# The archive apt installs this machine's packages from (its bookworm entry, else its first
# Debian archive), for debootstrap.
debian_mirror() {
  local targets
  targets=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 'Created-By: Packages' 2>/dev/null | sort -u)
  local uri
  uri=$(awk -v s="$suite" '$2 == s {print $1; exit}' <<<"$targets")
  [ -n "$uri" ] || uri=$(awk '$2 !~ /-/ {print $1; exit}' <<<"$targets")
  echo "${uri:-http://deb.debian.org/debian/}"
}

make_local_base() {
  local tarball=$cache/base-$suite.tar
  mkdir -p "$cache"
  if [ ! -s "$tarball" ]; then
    local mirror root started=$SECONDS
    mirror=$(debian_mirror)
    root=$(mktemp -d "$cache/rootfs.XXXXXX")
    echo "image: making the base $local_base with debootstrap from $mirror (a few minutes, once)" >&2
    if ! debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        "$suite" "$root" "$mirror" > "$cache/debootstrap.log" 2>&1; then
      tail -20 "$cache/debootstrap.log" >&2
      rm -rf "$root"
      echo "image: debootstrap failed; see $cache/debootstrap.log" >&2
      return 1
    fi
    # What an image does not need: downloaded packages and package lists, docs, locales.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
           "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
    tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
    rm -rf "$root"
    mv "$tarball.tmp" "$tarball"
    echo "image: base made in $((SECONDS - started)) s" >&2
  fi
  podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "Debian $suite (minbase, python3, python3-venv, ca-certificates) made by scripts/build_image.sh" \
    "$tarball" "$local_base" >/dev/null
}

if [ "$base_choice" = debian-local ]; then
  base=$local_base
  podman image exists "$base" || make_local_base
else
  base=$base_choice
fi

tag=$repository:$version
iidfile=$(mktemp)
trap 'rm -f "$iidfile"' EXIT
started=$SECONDS
echo "image: building $tag from $base" >&2
# The RUN steps reach the package index as this machine does: over its network, trusting its
# certificate authorities (mounted for the build only; pip reads them through PIP_CERT).
ca_bundle=/etc/ssl/certs/ca-certificates.crt
bash scripts/podman.sh build --network host --layers --volume "$ca_bundle:$ca_bundle:ro" \
  -f deploy/docker/Dockerfile --ignorefile deploy/docker/Dockerfile.dockerignore \
  --build-arg "BASE=$base" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.title=exactly" \
  --iidfile "$iidfile" -t "$tag" . >&2
echo "image: built $tag in $((SECONDS - started)) s" >&2
if [ -n "${IMAGE_ID_FILE:-}" ]; then
  cp "$iidfile" "$IMAGE_ID_FILE"
fi
echo "$tag"
