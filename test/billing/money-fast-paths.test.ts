import { Decimal } from 'decimal.js';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  difference,
  formatAmount,
  fromUnits,
  LEDGER_SCALE,
  Money,
  maxUnits,
  minUnits,
  parseUnits,
  toUnits,
} from '../../src/core/money.ts';
import { tokenCost, tokenHold } from '../../src/metering/cost.ts';
import { promptTokensUpperBound } from '../../src/tokens/count.ts';

/**
 * The request path prices and formats amounts without decimal.js where it can (plain decimal strings,
 * integer units of a price, the escrow's and the settle's amounts as bigint units): every result must
 * be decimal.js's, digit for digit.
 */

/** formatAmount as it was: through decimal.js. */
function referenceFormat(value: Decimal.Value): string {
  const s = new Money(value).toFixed();
  return s.includes('.') ? s.replace(/0+$/, '').replace(/\.$/, '') : s;
}

const MILLION = new Money(1_000_000);

/** tokenCost as it was: decimal.js all the way. */
function referenceCost(
  p: { inputPerMillion: Money; outputPerMillion: Money; cachedInputPerMillion?: Money },
  input: number,
  output: number,
  cachedInput = 0,
): string {
  const cached = Math.min(cachedInput, input);
  return referenceFormat(
    p.inputPerMillion
      .times(input - cached)
      .plus((p.cachedInputPerMillion ?? p.inputPerMillion).times(cached))
      .plus(p.outputPerMillion.times(output))
      .div(MILLION),
  );
}

const decimalText = fc
  .tuple(
    fc.boolean(),
    fc.stringMatching(/^\d{1,30}$/),
    fc.option(fc.stringMatching(/^\d{1,30}$/), { nil: undefined }),
  )
  .map(
    ([negative, whole, fraction]) =>
      `${negative ? '-' : ''}${whole}${fraction === undefined ? '' : `.${fraction}`}`,
  );

const price = fc.oneof(
  fc.constantFrom('0', '0.15', '0.6', '2.5', '10', '0.000001', '1000000000', '60.000000', '1e-7', '1e-20'),
  fc
    .tuple(fc.nat(100_000), fc.nat(999_999), fc.nat(6))
    .map(([whole, fraction, digits]) =>
      digits === 0 ? String(whole) : `${whole}.${String(fraction).padStart(6, '0').slice(0, digits)}`,
    ),
);
const tokens = fc.oneof(
  fc.nat(1000),
  fc.nat(10_000_000),
  fc.constantFrom(0, 1, 2 ** 31, 2 ** 40, 2 ** 52, 9e15),
);

describe('amounts on the request path', () => {
  it('formatAmount is decimal.js’s canonical form for strings, decimals and numbers', () => {
    const samples = ['0', '-0', '-0.000', '000.000', '007.50', '-0.50', '0.000123000', '100000.000000000000'];
    for (const v of [...samples, '1e-7', '-1e-7', '.5', '+1', 0, 0.1, -5, 1e21]) {
      expect(formatAmount(v)).toBe(referenceFormat(v));
    }
    fc.assert(
      fc.property(decimalText, (text) => {
        expect(formatAmount(text)).toBe(referenceFormat(text));
        expect(formatAmount(new Money(text))).toBe(referenceFormat(text));
        expect(formatAmount(new Decimal(text))).toBe(referenceFormat(text));
      }),
      { numRuns: 5000 },
    );
    expect(() => formatAmount('abc')).toThrow();
  });

  it('tokenCost and tokenHold are exact, as with decimal.js', () => {
    fc.assert(
      fc.property(
        price,
        price,
        fc.option(price, { nil: undefined }),
        tokens,
        tokens,
        tokens,
        (input, output, cached, i, o, c) => {
          const p = {
            inputPerMillion: new Money(input),
            outputPerMillion: new Money(output),
            ...(cached === undefined ? {} : { cachedInputPerMillion: new Money(cached) }),
          };
          expect(tokenCost(p, i, o, c)).toBe(referenceCost(p, i, o, c));
          const full = { ...p, cachedInputPerMillion: p.cachedInputPerMillion ?? p.inputPerMillion };
          const dearer = Money.max(full.inputPerMillion, full.cachedInputPerMillion);
          expect(tokenHold(full, i, o)).toBe(
            referenceCost({ inputPerMillion: dearer, outputPerMillion: full.outputPerMillion }, i, o),
          );
        },
      ),
      { numRuns: 5000 },
    );
  });

  it('tokenCost with cache writes (5-minute and 1-hour prices) is exact, as with decimal.js', () => {
    const split = fc.tuple(tokens, tokens, tokens, tokens, tokens);
    fc.assert(
      fc.property(price, price, price, price, price, split, (input, output, cached, write, write1h, t) => {
        const [i, o, c, w, w1h] = t;
        const p = {
          inputPerMillion: new Money(input),
          outputPerMillion: new Money(output),
          cachedInputPerMillion: new Money(cached),
          cacheWritePerMillion: new Money(write),
          cacheWrite1hPerMillion: new Money(write1h),
        };
        const read = Math.min(c, i);
        const written = Math.min(w, i - read);
        const hour = Math.min(w1h, written);
        const expected = referenceFormat(
          p.inputPerMillion
            .times(i - read - written)
            .plus(p.cachedInputPerMillion.times(read))
            .plus(p.cacheWritePerMillion.times(written - hour))
            .plus(p.cacheWrite1hPerMillion.times(hour))
            .plus(p.outputPerMillion.times(o))
            .div(MILLION),
        );
        expect(tokenCost(p, i, o, c, { write: w, write1h: w1h })).toBe(expected);
      }),
      { numRuns: 5000 },
    );
    // Anthropic's published case: 200 000 input, 1 000 000 written, 1 000 output at 10 / 110 per million.
    const claude = { inputPerMillion: new Money('10'), outputPerMillion: new Money('110') };
    const prices = {
      ...claude,
      cacheWritePerMillion: new Money('12.5'),
      cacheWrite1hPerMillion: new Money('20'),
    };
    expect(tokenCost(claude, 1_200_000, 1000)).toBe('12.11');
    expect(tokenCost(prices, 1_200_000, 1000, 0, { write: 1_000_000, write1h: 0 })).toBe('14.61');
    expect(tokenCost(prices, 1_200_000, 1000, 0, { write: 1_000_000, write1h: 1_000_000 })).toBe('22.11');
  });

  it('the prompt bound is ceil(count × margin), as with decimal.js', () => {
    const margins = ['1', '1.1', '1.25', '1.7', '1.9', '10', '1.001', '9.999', '01.5'];
    fc.assert(
      fc.property(fc.constantFrom(...margins), tokens, (margin, count) => {
        expect(promptTokensUpperBound(count, margin)).toBe(new Money(count).times(margin).ceil().toNumber());
      }),
      { numRuns: 5000 },
    );
  });

  it('amounts in units (the escrow and the settle) compute as decimal.js does, on costs of random prices and usages', () => {
    // prices as the pricing file takes them (at most PRICE_SCALE decimals): costs of at most LEDGER_SCALE
    const filePrice = price.filter((p) => /^\d+(\.\d{1,6})?$/.test(p));
    const ledgerAmount = fc.oneof(
      fc
        .tuple(filePrice, filePrice, tokens, tokens)
        .map(([input, output, i, o]) =>
          tokenCost({ inputPerMillion: new Money(input), outputPerMillion: new Money(output) }, i, o),
        ),
      decimalText.filter((t) => (t.split('.')[1]?.length ?? 0) <= LEDGER_SCALE),
    );
    const step = fc.tuple(fc.constantFrom('plus', 'minus', 'min', 'max', 'times'), ledgerAmount, fc.nat(64));
    fc.assert(
      fc.property(ledgerAmount, fc.array(step, { maxLength: 12 }), (start, steps) => {
        let units = toUnits(start);
        let decimal = new Money(start);
        expect(fromUnits(units)).toBe(referenceFormat(start));
        for (const [op, amount, n] of steps) {
          const u = toUnits(amount);
          const d = new Money(amount);
          expect(units < u).toBe(decimal.lt(d));
          expect(units === u).toBe(decimal.eq(d));
          if (op === 'plus') [units, decimal] = [units + u, decimal.plus(d)];
          else if (op === 'minus') [units, decimal] = [units - u, decimal.minus(d)];
          else if (op === 'min') [units, decimal] = [minUnits(units, u), Money.min(decimal, d)];
          else if (op === 'max') [units, decimal] = [maxUnits(units, u), Money.max(decimal, d)];
          else [units, decimal] = [units * BigInt(n), decimal.times(n)];
          expect(fromUnits(units)).toBe(referenceFormat(decimal));
          expect(toUnits(fromUnits(units))).toBe(units);
        }
      }),
      { numRuns: 5000 },
    );
    // Postgres NUMERIC text of a wider scale: its trailing zeros are no finer digits.
    expect(toUnits('0.000005100000000000')).toBe(5_100_000n);
    expect(fromUnits(toUnits('-12.500'))).toBe('-12.5');
  });

  it('an amount finer than the ledger, or not a plain decimal, is no amount in units', () => {
    for (const text of ['0.0000000000001', '1e-7', '.5', '+1', '1.', '', ' 1', 'abc', '0x10', '1_000']) {
      expect(parseUnits(text)).toBeUndefined();
      expect(() => toUnits(text)).toThrow(RangeError);
    }
  });

  it('difference is decimal.js’s, in units or (for finer amounts) not', () => {
    fc.assert(
      fc.property(decimalText, decimalText, (a, b) => {
        expect(difference(a, b)).toBe(referenceFormat(new Money(a).minus(b)));
      }),
      { numRuns: 5000 },
    );
  });
});
