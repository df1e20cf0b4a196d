#!/usr/bin/env python3
"""Records biome's binaries for other platforms in package-lock.json.

The package registry reachable from our machines carries only the Linux glibc builds of
@biomejs/cli-*, so `npm install` leaves the other platforms' optional packages out of the lockfile and
`npm ci` then refuses the lockfile as out of sync. Entries with their os/cpu/libc make the lockfile
complete; npm skips them on other platforms without fetching them. Run after changing the biome
version: `python3 scripts/lock-foreign-platforms.py`.
"""
import json
import pathlib

LOCK = pathlib.Path(__file__).resolve().parent.parent / 'package-lock.json'
PLATFORMS = {
    'cli-android-arm64': {'os': ['android'], 'cpu': ['arm64']},
    'cli-android-x64': {'os': ['android'], 'cpu': ['x64']},
    'cli-darwin-arm64': {'os': ['darwin'], 'cpu': ['arm64']},
    'cli-darwin-x64': {'os': ['darwin'], 'cpu': ['x64']},
    'cli-linux-arm64-musl': {'os': ['linux'], 'cpu': ['arm64'], 'libc': ['musl']},
    'cli-linux-x64-musl': {'os': ['linux'], 'cpu': ['x64'], 'libc': ['musl']},
    'cli-win32-arm64': {'os': ['win32'], 'cpu': ['arm64']},
    'cli-win32-x64': {'os': ['win32'], 'cpu': ['x64']},
}

lock = json.loads(LOCK.read_text())
packages = lock['packages']
version = packages['node_modules/@biomejs/biome']['version']
added = []
for name, platform in PLATFORMS.items():
    key = f'node_modules/@biomejs/{name}'
    if key in packages:
        continue
    packages[key] = {
        'version': version,
        'cpu': platform['cpu'],
        'dev': True,
        **({'libc': platform['libc']} if 'libc' in platform else {}),
        'license': 'MIT OR Apache-2.0',
        'optional': True,
        'os': platform['os'],
        'engines': {'node': '>=14.21.3'},
    }
    added.append(name)
lock['packages'] = dict(sorted(packages.items(), key=lambda kv: (kv[0] != '', kv[0])))
LOCK.write_text(json.dumps(lock, indent=2) + '\n')
print(f"added {', '.join(added) or 'nothing'}")
