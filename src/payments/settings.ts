import { z } from 'zod';
import { badRequest } from '../core/errors.ts';
import { amountSchema, formatAmount, formatForCurrency, Money } from '../core/money.ts';
import { parseInput } from '../core/validation.ts';
import type { PaymentSettings } from '../db/schema.ts';

/**
 * A project's top-up options, in its currency: the preset amounts, the minimum and maximum of a top-up,
 * and auto-recharge (offered or not, the default threshold, amount and monthly cap). Checked and
 * completed with defaults when a connection is made or changed, and read back the same way.
 */

export const autoRechargeSettingsSchema = z.strictObject({
  offered: z.boolean().optional(),
  threshold: z.string().optional(),
  amount: z.string().optional(),
  monthlyCap: z.string().optional(),
});

export const paymentSettingsSchema = z.strictObject({
  presets: z.array(z.string()).max(6).optional(),
  minimum: z.string().optional(),
  maximum: z.string().optional(),
  autoRecharge: autoRechargeSettingsSchema.optional(),
});

export type PaymentSettingsInput = z.infer<typeof paymentSettingsSchema>;

/** The project's top-up options in its currency, checked: presets, minimum and maximum. */
export function checkSettings(
  currency: string,
  input: PaymentSettingsInput | PaymentSettings | undefined,
): Required<PaymentSettings> {
  const amount = (param: string, v: string) =>
    parseInput(z.object({ [param]: amountSchema(currency) }), { [param]: v })[param] as string;
  const minimum = amount('settings.minimum', input?.minimum ?? defaultMinimum(currency));
  const maximum = amount('settings.maximum', input?.maximum ?? defaultMaximum(currency));
  if (new Money(maximum).lt(minimum)) throw badRequest('must be at least the minimum', 'settings.maximum');
  const presets = (input?.presets ?? defaultPresets(currency)).map((p, i) => {
    const v = amount(`settings.presets.${i}`, p);
    if (new Money(v).lt(minimum) || new Money(v).gt(maximum))
      throw badRequest('must be between the minimum and the maximum', `settings.presets.${i}`);
    return v;
  });
  // Auto-recharge: off unless offered; one recharge lies within the top-up minimum and maximum.
  const ar = input?.autoRecharge;
  const rechargeAmount = amount('settings.autoRecharge.amount', ar?.amount ?? presets[1] ?? minimum);
  if (new Money(rechargeAmount).lt(minimum) || new Money(rechargeAmount).gt(maximum))
    throw badRequest('must be between the minimum and the maximum', 'settings.autoRecharge.amount');
  const threshold = amount('settings.autoRecharge.threshold', ar?.threshold ?? minimum);
  if (new Money(threshold).gt(maximum))
    throw badRequest('must be at most the maximum', 'settings.autoRecharge.threshold');
  const monthlyCap = amount(
    'settings.autoRecharge.monthlyCap',
    ar?.monthlyCap ?? formatAmount(new Money(rechargeAmount).times(5)),
  );
  if (new Money(monthlyCap).lt(rechargeAmount))
    throw badRequest('must be at least the recharge amount', 'settings.autoRecharge.monthlyCap');
  return {
    presets,
    minimum,
    maximum,
    autoRecharge: { offered: ar?.offered ?? false, threshold, amount: rechargeAmount, monthlyCap },
  };
}

const zeroDecimal = (currency: string) => formatForCurrency('1', currency) === '1';
const defaultMinimum = (c: string) => (zeroDecimal(c) ? '500' : '5');
const defaultMaximum = (c: string) => (zeroDecimal(c) ? '100000' : '1000');
const defaultPresets = (c: string) => (zeroDecimal(c) ? ['500', '1000', '2000'] : ['5', '10', '20']);
