// Adds the lock entries `npm install` leaves out when the registry it uses
// lacks some platforms' builds of an optional native package (a 404 on an
// optional dependency is skipped silently). `npm ci` refuses a lock that
// misses them, on every platform. Each entry gets the version its parent asks
// for and the os/cpu/libc its name says, so npm skips it on other platforms
// and fetches it from the registry on its own.
//
// Run after changing the pinned versions: `npm install && node complete-lock.mjs`.

import { readFileSync, writeFileSync } from 'node:fs';

const path = new URL('./package-lock.json', import.meta.url);
const lock = JSON.parse(readFileSync(path, 'utf8'));
const packages = lock.packages;

/**
 * Whether `name` resolves from the package at `from`, as node looks it up.
 * A linked package (`file:` dependency, keyed by its relative path) looks in
 * its own `node_modules`, then in the root's.
 */
function resolves(from, name) {
  for (let dir = from; ; ) {
    if (packages[`${dir ? `${dir}/` : ''}node_modules/${name}`]) return true;
    if (dir === '') return false;
    const up = dir.replace(/\/?node_modules\/(@[^/]+\/)?[^/]+$/, '');
    dir = up === dir ? '' : up;
  }
}

/** `os`, `cpu` and `libc` from a name such as `binding-linux-arm64-musl`. */
function platform(name) {
  const [os, cpu, abi] = name
    .split('/')
    .pop()
    .replace(/^.*?-(?=(android|darwin|freebsd|linux|openharmony|win32|wasm32)-)/, '')
    .split('-');
  if (os === 'wasm32') return { cpu: ['wasm32'] };
  if (os === 'linux') return { cpu: [cpu], libc: [abi === 'musl' ? 'musl' : 'glibc'], os: [os] };
  return { cpu: [cpu], os: [os] };
}

let added = 0;
for (const [at, entry] of Object.entries(packages)) {
  for (const [name, spec] of Object.entries(entry.optionalDependencies ?? {})) {
    if (resolves(at, name)) continue;
    const { cpu, libc, os } = platform(name);
    packages[`node_modules/${name}`] = {
      version: spec.replace(/^[\^~=]/, ''),
      cpu,
      dev: true,
      ...(libc && { libc }),
      optional: true,
      ...(os && { os }),
    };
    console.log(`added node_modules/${name}`);
    added += 1;
  }
}
const sorted = Object.keys(packages).sort((a, b) => a.localeCompare(b, 'en'));
lock.packages = Object.fromEntries(sorted.map((k) => [k, packages[k]]));
writeFileSync(path, `${JSON.stringify(lock, null, 2)}\n`);
console.log(`${added} entries added`);
