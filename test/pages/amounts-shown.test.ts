import { describe, expect, it } from 'vitest';
import { displayAmount } from '../../src/core/money.ts';
import { money } from '../../src/html/index.ts';

/**
 * Pages show amounts at their currency's precision (the ledger keeps up to 12 decimals), with the exact
 * value on hover: rounding never hides that a tiny amount is not zero.
 */
describe('amounts shown on pages', () => {
  it("rounds to the currency's decimals, and says when a non-zero amount rounds to zero", () => {
    expect(displayAmount('9.999982', 'usd')).toBe('10.00');
    expect(displayAmount('0.010018', 'usd')).toBe('0.01');
    expect(displayAmount('5', 'usd')).toBe('5.00');
    expect(displayAmount('-0.25', 'usd')).toBe('-0.25');
    expect(displayAmount('0', 'usd')).toBe('0.00');
    expect(displayAmount('0.000018', 'usd')).toBe('<0.01');
    expect(displayAmount('-0.000018', 'usd')).toBe('-<0.01');
    expect(displayAmount('1500.4', 'jpy')).toBe('1500');
    expect(displayAmount('0.0004', 'jpy')).toBe('<1');
    expect(displayAmount('1.2345', 'kwd')).toBe('1.234');
  });

  it('puts the exact value in a title only when the shown one differs', () => {
    expect(money('0.010018', 'usd').html).toBe('<span title="0.010018">0.01</span>');
    expect(money('0.000018', 'usd').html).toBe('<span title="0.000018">&lt;0.01</span>');
    expect(money('0.25', 'usd').html).toBe('0.25');
    expect(money('5', 'usd').html).toBe('5.00');
  });
});
