import { lookup as dnsLookup, type LookupAddress } from 'node:dns';
import { BlockList, isIP } from 'node:net';
import type { Config } from '../config/index.ts';

/**
 * Where a webhook may be sent. Private, loopback, link-local, carrier-grade NAT, multicast, reserved and
 * cloud-metadata addresses are refused unless WEBHOOK_ALLOW_PRIVATE_NETWORKS is set. The check runs when
 * a subscription is saved and again inside the connection's DNS lookup at send time, so the address
 * checked is the address connected to (a name that later resolves somewhere private is still refused).
 */
const blocked = new BlockList();
for (const [net, prefix] of [
  ['0.0.0.0', 8],
  ['10.0.0.0', 8],
  ['100.64.0.0', 10],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['172.16.0.0', 12],
  ['192.0.0.0', 24],
  ['192.0.2.0', 24],
  ['192.88.99.0', 24],
  ['192.168.0.0', 16],
  ['198.18.0.0', 15],
  ['198.51.100.0', 24],
  ['203.0.113.0', 24],
  ['224.0.0.0', 4],
  ['240.0.0.0', 4],
] as const) {
  blocked.addSubnet(net, prefix, 'ipv4');
}
for (const [net, prefix] of [
  ['::', 128],
  ['::1', 128],
  ['64:ff9b:1::', 48],
  ['100::', 64],
  ['2001:db8::', 32],
  ['fc00::', 7],
  ['fe80::', 10],
  ['fec0::', 10],
  ['ff00::', 8],
] as const) {
  blocked.addSubnet(net, prefix, 'ipv6');
}

/** The IPv4 address embedded in an IPv4-mapped, IPv4-compatible or NAT64 IPv6 address. */
function embeddedIpv4(address: string): string | undefined {
  const lower = address.toLowerCase();
  const dotted = /^(?:::ffff:|::|64:ff9b::)(\d+\.\d+\.\d+\.\d+)$/.exec(lower);
  if (dotted) return dotted[1];
  const hex = /^(?:::ffff:|64:ff9b::)([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(lower);
  if (hex) {
    const hi = Number.parseInt(hex[1]!, 16);
    const lo = Number.parseInt(hex[2]!, 16);
    return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
  }
  return undefined;
}

/** True for an address a webhook must not reach on a public deployment. */
export function isPrivateAddress(address: string): boolean {
  const family = isIP(address);
  if (family === 4) return blocked.check(address, 'ipv4');
  if (family === 6) {
    const v4 = embeddedIpv4(address);
    if (v4) return blocked.check(v4, 'ipv4');
    return blocked.check(address, 'ipv6');
  }
  return true;
}

export class DestinationError extends Error {
  readonly code: 'private_address' | 'unresolvable' | 'invalid_url';
  constructor(code: DestinationError['code'], message: string) {
    super(message);
    this.code = code;
  }
}

/** The host of a URL without IPv6 brackets. */
export function hostOf(url: URL): string {
  return url.hostname.replace(/^\[|\]$/g, '');
}

function resolveAll(host: string): Promise<LookupAddress[]> {
  return new Promise((resolve, reject) => {
    dnsLookup(host, { all: true, verbatim: true }, (err, addresses) => {
      if (err) reject(err);
      else resolve(addresses);
    });
  });
}

/**
 * Checks a destination URL's host: an address literal directly, a name through DNS (every address it
 * resolves to must be public). Throws DestinationError.
 */
export async function checkDestination(config: Pick<Config, 'WEBHOOK_ALLOW_PRIVATE_NETWORKS'>, url: URL) {
  if (config.WEBHOOK_ALLOW_PRIVATE_NETWORKS) return;
  const host = hostOf(url);
  if (isIP(host)) {
    if (isPrivateAddress(host))
      throw new DestinationError('private_address', `${host} is a private, loopback or reserved address`);
    return;
  }
  if (host === 'localhost' || host.endsWith('.localhost') || host.endsWith('.internal'))
    throw new DestinationError('private_address', `${host} is a local name`);
  let addresses: LookupAddress[];
  try {
    addresses = await resolveAll(host);
  } catch (err) {
    throw new DestinationError(
      'unresolvable',
      `${host} could not be resolved (${(err as NodeJS.ErrnoException).code ?? 'DNS error'})`,
    );
  }
  const bad = addresses.find((a) => isPrivateAddress(a.address));
  if (bad)
    throw new DestinationError(
      'private_address',
      `${host} resolves to ${bad.address}, a private, loopback or reserved address`,
    );
}

type LookupCallback = (
  err: NodeJS.ErrnoException | null,
  address: string | LookupAddress[],
  family?: number,
) => void;

/**
 * A `lookup` for net/tls connections that refuses names resolving to blocked addresses, so the check
 * and the connection use the same answer.
 */
export function guardedLookup(
  hostname: string,
  options: { all?: boolean; family?: number | string } | undefined,
  callback: LookupCallback,
): void {
  dnsLookup(hostname, { ...(options ?? {}), all: true, verbatim: true } as never, (err, result) => {
    if (err) return callback(err, '');
    const addresses = result as unknown as LookupAddress[];
    const bad = addresses.find((a) => isPrivateAddress(a.address));
    if (bad || addresses.length === 0) {
      const error = new Error(
        bad
          ? `refused: ${hostname} resolves to ${bad.address}, a private, loopback or reserved address`
          : `refused: ${hostname} has no address`,
      ) as NodeJS.ErrnoException;
      error.code = 'EPRIVATEADDRESS';
      return callback(error, '');
    }
    if (options?.all) return callback(null, addresses);
    const first = addresses[0]!;
    callback(null, first.address, first.family);
  });
}
