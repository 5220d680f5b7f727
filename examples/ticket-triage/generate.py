#!/usr/bin/env python3
"""Generate the synthetic support tickets of the ticket-triage example.

The company is fictional: "Lumen & Pine", an online home-goods store with a subscription app
(plans Starter to Business). Every ticket is built from a per-category template, slot fillers
(products, order numbers, amounts, dates, error messages, devices, ...), a customer tone
(neutral, polite, angry, terse), optional greeting / context / sign-off and occasional typos.
The label is the primary intent of the ticket; about 4% of the tickets mention two intents on
purpose (the label is the one the customer asks to be resolved).

Standard library only and seeded: running it again rewrites data/tickets.jsonl byte for byte.

    python examples/ticket-triage/generate.py            # rewrite data/tickets.jsonl
    python examples/ticket-triage/generate.py --stats    # also print counts and lengths
    python examples/ticket-triage/generate.py --out DIR  # write DIR/tickets.jsonl instead
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

SEED = 1234
PER_LABEL = 122  # 6 x 122 = 732 tickets
AMBIGUOUS_PER_LABEL = 5  # ~4% of the tickets mention two intents
TERSE_PER_LABEL = 20
MAX_WORDS = 140
MAX_JACCARD = 0.6  # word-set similarity allowed between any two tickets
FILENAME = "tickets.jsonl"
LABELS = ["billing", "technical", "account", "shipping", "refund", "feature_request"]

# --------------------------------------------------------------------------- slot fillers

PRODUCTS = [
    "wireless earbuds", "standing desk", "espresso grinder", "yoga mat", "mechanical keyboard",
    "desk lamp", "hiking backpack", "air fryer", "phone case", "smart thermostat", "duvet cover",
    "running shoes", "water bottle", "office chair", "bluetooth speaker", "cast iron skillet",
    "winter jacket", "baby monitor", "gaming mouse", "ceramic mug set", "robot vacuum",
    "electric toothbrush", "throw blanket", "monitor arm", "rain boots", "camping stove",
    "linen shirt", "chef's knife", "USB-C hub", "plant pot set", "bedside table", "tea kettle",
]
COLORS = ["blue", "black", "white", "grey", "green", "red", "sand", "navy"]
PLANS = ["Starter", "Basic", "Plus", "Pro", "Team", "Business", "Premium"]
MONTHS = [
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
ERRORS = [
    "Error 500: Internal Server Error", "Something went wrong. Please try again later.",
    "ERR_CONNECTION_RESET", "Request timed out", "Unable to load workspace",
    "TypeError: Cannot read properties of undefined (reading 'id')", "503 Service Unavailable",
    "Sync failed (code 0x80070005)", "Unexpected token < in JSON at position 0",
    "Oops! We couldn't process your request", "Upload failed: file could not be read",
    "SSL handshake failed", "Error 422: Unprocessable Entity", "Network error (-1009)",
    "App not responding", "Failed to fetch", "Error code E-4012", "Page not found (404)",
]
DEVICES = [
    "iPhone 13", "iPhone 15 Pro", "Pixel 7", "Samsung Galaxy S22", "Galaxy A54", "iPad Air",
    "MacBook Air", "Windows 11 laptop", "Chromebook", "OnePlus 11", "Android tablet", "iMac",
]
BROWSERS = ["Chrome", "Firefox", "Safari", "Edge", "Brave", "Chrome on Windows", "Safari on Mac"]
ACTIONS = [
    "upload a photo", "save my settings", "export a report", "open the dashboard",
    "check out", "connect my calendar", "add an item to my cart", "sync my data",
    "download an invoice PDF", "view my order history", "update my profile picture",
    "print a shipping label", "apply a filter", "attach a file", "share a list",
]
SCREENS = [
    "the settings page", "my order history", "the billing page", "the cart", "the reports tab",
    "my profile", "the checkout page", "the home screen", "the search page", "the inbox",
]
INTEGRATIONS = ["Slack", "Google Calendar", "Shopify", "Zapier", "QuickBooks", "Outlook", "HubSpot"]
FIRST_NAMES = [
    "Anna", "Ben", "Carla", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
    "Kemi", "Liam", "Maya", "Noah", "Olga", "Priya", "Quentin", "Rosa", "Sam", "Tariq",
    "Uma", "Victor", "Wen", "Yusuf", "Zoe", "Marek", "Lucia", "Tom", "Aisha", "Pedro",
]
LAST_NAMES = [
    "Smith", "Garcia", "Nguyen", "Muller", "Rossi", "Kowalski", "Okafor", "Tanaka", "Silva",
    "Jensen", "Patel", "Haddad", "Dubois", "Novak", "Brown",
]
EMAIL_DOMAINS = ["example.com", "example.org", "example.net", "mail.example.com"]
COUNTRIES = [
    "Canada", "Germany", "Australia", "Mexico", "Japan", "Ireland", "Brazil", "Norway",
    "New Zealand", "South Africa", "Portugal", "Singapore",
]
CARRIERS = ["UPS", "FedEx", "DHL", "USPS", "Royal Mail", "Canada Post", "the courier"]
COUPONS = ["SPRING20", "WELCOME10", "FALLSALE", "LOYAL15", "FREESHIP", "BF2024", "STUDENT25"]
COMPANIES = [
    "Acme Robotics GmbH", "Bright Path Consulting", "Harbor Dental LLC", "Nordlicht Design AB",
    "Greenway Logistics", "Tallis & Co", "Blue Fern Studio", "Orbit Analytics Ltd",
]
STREETS = ["Maple Ave", "High Street", "Elm Road", "Kingsway", "Baker St", "Oak Lane", "Main St"]
CITIES = ["Portland", "Leeds", "Austin", "Denver", "Bristol", "Toronto", "Madison", "Dublin"]
FEATURES = [
    "dark mode", "a CSV export of my orders", "Apple Pay at checkout", "split payments across two cards",
    "bulk download of invoices", "a refund status tracker in the app", "SMS alerts when my order ships",
    "login with Face ID", "two-factor authentication with an authenticator app",
    "scheduled delivery windows", "keyboard shortcuts", "an offline mode", "webhooks for order events",
    "a family plan", "gift wrapping", "shareable wish lists", "a Linux desktop app",
    "more than five seats on the Starter plan", "recurring orders", "a pickup point option",
    "multi-currency invoices", "custom fields on contacts", "a Spanish translation of the app",
    "calendar sync with Outlook", "saved payment methods for team members", "a widget for the home screen",
    "an undo button", "tags on orders", "in-app chat with support", "a monthly spending report",
]
FEATURE_VERBS = [
    "pause my subscription instead of cancelling it", "export all my orders to Excel",
    "pick the delivery day myself", "log in with a passkey", "see the status of a refund",
    "merge duplicate contacts", "reorder the columns on the dashboard", "set a spending limit per user",
    "add notes to an order", "choose which emails I get", "filter invoices by project",
    "schedule reports to be emailed every Monday", "save a cart for later",
    "assign tickets to teammates", "change the font size", "group orders by store",
]

# --------------------------------------------------------------------------- templates
# Each category has normal templates, terse one-liners and "ambiguous" templates that mention
# a second intent; the label is always the intent the customer wants resolved.

TEMPLATES: dict[str, dict[str, list[str]]] = {
    "billing": {
        "normal": [
            "Why was I charged {amount} {when}? I don't recognize this charge on my card statement and I didn't change anything on my {plan} plan.",
            "I think I was billed twice this month for the {plan} subscription, two charges of {amount} each. Can you check what happened with my billing?",
            "How do I update the credit card on file? My old card expired and now the renewal of my {plan} plan failed.",
            "Could you send me a copy of the invoice for {month}? Our accounting team needs it with our VAT number on it.",
            "My payment keeps getting declined at checkout even though the card works everywhere else. Is there a problem on your side with processing payments?",
            "What's the price difference between {plan} and {plan2}? If I upgrade in the middle of the cycle, am I charged the full amount or is it prorated?",
            "Invoice {invoice} says {amount} but the quote we agreed on was {amount2}. Please correct the invoice before we pay it.",
            "I switched to annual billing {when} but I'm still being charged monthly. Can you fix the billing cycle on my account?",
            "Is sales tax included in your prices? I expected to pay {amount2} but my card was charged {amount}.",
            "Please change the company name and billing address on our invoices to {company}, {street_address}. All future invoices should show this.",
            "Can I pay by bank transfer or PayPal instead of a credit card? Our company policy doesn't allow cards for software.",
            "We have {n} seats on our {plan} plan but the last invoice bills us for {n2}. Could you adjust the subscription?",
            "I want to downgrade from {plan} to {plan2} at the next renewal. Will the next invoice reflect the lower price automatically?",
            "Where can I download receipts for my past orders? I need them for my expense report, ideally as PDFs.",
            "I got an email saying my payment of {amount} failed, but my bank shows the money was taken. Which one is right? I don't want my service interrupted.",
            "Do you offer a discount for nonprofits or for paying yearly? We're a small charity and {amount} a month is a lot for us.",
            "The coupon {coupon} didn't apply at checkout so I paid full price. I don't need a refund, can you just apply the discount to my next bill?",
            "If I add {n} more users in the middle of the month, how will that show up on the bill?",
            "There's a charge of {amount} labelled 'LUMEN*PINE SUBSCR' on my statement. What exactly is it for?",
            "Your pricing page says {plan} is {amount2} per month but I'm paying {amount}. Was there a price increase I wasn't told about?",
            "Our finance department needs invoices sent to {email} instead of my personal address. How do I set up a separate billing contact?",
            "The auto-renewal charged my personal card instead of the company card I added {when}. Can you make the company card the default payment method?",
        ],
        "terse": [
            "invoice for {month} pls",
            "card declined again??",
            "how do I change my payment method",
            "need a receipt for order {order}",
            "why {amount} this month",
            "Billed for {n2} seats, we have {n}.",
            "VAT number missing on invoice {invoice}",
            "charged {amount} {when}, what is this for",
        ],
        "ambiguous": [
            "The app kept freezing during checkout so I tried three times, and now I see three charges of {amount}. The freezing is annoying but what I need right now is for my bill to show the correct single charge.",
            "Quick question before I decide whether to cancel: why did my {plan} plan go from {amount2} to {amount} this month? Nobody told me about a price change.",
            "I'm not asking for money back, I just need an invoice that shows the charge of {amount} from {when} with our company details on it.",
            "Would be nice if you added PayPal, but for now: my card payment for the {plan} renewal failed and I need to know how else I can pay before the account gets suspended.",
            "I can log in fine, the problem is the billing page shows a balance of {amount} that I already paid {when}. Please check your records.",
        ],
    },
    "refund": {
        "normal": [
            "I returned the {product} {when} and still haven't received my refund. The order number is {order}.",
            "I cancelled my {plan} subscription before the renewal date but was still charged {amount}. I'd like that money back.",
            "The {product} stopped working after two days. I want a full refund please, not a replacement.",
            "How long does a refund usually take to show up on my card? You told me it was approved {when}.",
            "I was charged twice for order {order}. Please put the duplicate {amount} back on my card.",
            "The {product} isn't what I expected at all and I'd like to send it back. How do I get my money back?",
            "My order {order} never arrived and the tracking has been stuck for weeks. At this point I just want my money back.",
            "You refunded {amount2} but I paid {amount} for the {product}. Where is the rest of my money?",
            "Please cancel order {order} and give me my money back, I ordered the wrong size by mistake.",
            "I accidentally upgraded to {plan} and got charged {amount}. I haven't used any of the new features, can you reverse it?",
            "The {product} arrived scratched. I don't want a replacement, just reimburse me for it.",
            "Can the refund go to my PayPal instead of the original card? That card has been closed.",
            "My annual plan renewed automatically ({amount}) and I forgot to cancel. I haven't logged in once since then, could I get that back?",
            "Your website promises a 30-day money-back guarantee. I'm on day {n} and the {plan} plan isn't for me, so please process my refund.",
            "I bought a {amount} gift card that was never delivered to the recipient's email. Please return the money to my card.",
            "The price of the {product} dropped to {amount2} the day after I paid {amount}. Can I get the difference back?",
            "I sent the {product} back with the prepaid label {when}. The tracking shows you received it, but no refund yet.",
            "The store credit you gave me for order {order} is useless to me. I'd rather have the {amount} back on my card.",
            "Half of the items in order {order} were out of stock and never shipped, but I was charged the full {amount}. Please refund the missing items.",
            "We were promised a prorated refund when we removed {n} seats from our {plan} plan. It hasn't appeared on our card yet.",
        ],
        "terse": [
            "refund status for {order}?",
            "want my money back for the {product}",
            "still no refund. order {order}",
            "please refund {amount}",
            "Return + reimbursement for {order} please.",
            "cancel and refund order {order}",
            "where is my refund",
            "money back for the {plan} renewal pls",
        ],
        "ambiguous": [
            "I can't get into my account anymore and honestly I'm done with the service. Just refund last month's {amount} and close it, I'll go elsewhere.",
            "Order {order} finally arrived, two weeks late, and I no longer need the {product}. I'd like to return it for a full refund.",
            "Your app crashed in the middle of my purchase and charged me {amount} for an order that doesn't exist in my history. I don't need a bug report answer, I need the money returned.",
            "I was billed {amount} for the {plan} plan after I cancelled. I don't care about fixing the invoice, I want the payment reversed to my card.",
            "Nice idea to add a wish list, but that's not why I'm writing: the {product} I bought broke and I want my money back.",
        ],
    },
    "shipping": {
        "normal": [
            "Where is my order {order}? It was supposed to arrive {when} and I haven't heard anything.",
            "The tracking for order {order} has said 'label created' for {n} days. Has it actually shipped?",
            "I need to change the delivery address for order {order}, I moved last week. The new address is {street_address}, {city}.",
            "Do you ship to {country}? And roughly how long does delivery take?",
            "{carrier} says my package was delivered {when}, but there's nothing at my door or in the mailroom.",
            "My package arrived with the box crushed and the {product} inside is cracked. Can you send a replacement? A refund won't help, it's a gift.",
            "I only received {k} of the {n} items in order {order}. Is the rest coming in a separate package?",
            "Can I upgrade to express shipping? I really need the {product} before {day}.",
            "Order {order} shows as shipped but the tracking number doesn't work on the {carrier} website.",
            "I ordered the {product} but the box contained a {product2}. Please send me the right item.",
            "Is it possible to hold my delivery until {day}? I'm travelling and nobody will be home to sign for it.",
            "The courier left my parcel with a neighbour I don't know. How can I find out which house it's at?",
            "Customs is asking me to pay {amount} in import fees before they release my order. Was that not included in the shipping cost?",
            "I placed my order {when} and it still says 'processing'. When will it be dispatched?",
            "Can you combine my two orders {order} and {order2} into one shipment? Same address for both.",
            "My package was returned to your warehouse because the address was missing the apartment number. Can you reship it to {street_address}?",
            "If I order the {product} today with standard shipping, will it arrive before {day}?",
            "The delivery estimate for my order keeps moving, first it was {day}, now it's a week later. What is going on with the shipment?",
            "Tracking says my parcel has been sitting at the {carrier} depot in {city} for {n} days. Can you chase it?",
            "The driver marked order {order} as 'failed delivery - no access' but I was home all day. How do I rebook the delivery?",
        ],
        "terse": [
            "where's my package",
            "tracking not updating for {order}",
            "when will order {order} ship",
            "wrong item in box, order {order}",
            "Delivery address change for {order}?",
            "parcel stuck at {carrier} since {day}",
            "do you deliver to {country}",
            "has {order} been dispatched yet",
        ],
        "ambiguous": [
            "Love the {product} I got last month! Gift wrapping would be a nice option. Anyway, the real reason I'm writing: order {order} still hasn't shipped after {n} days.",
            "I was charged {amount} for express shipping on order {order} and it's now three days late. I don't need the money back, I need to know where the package is.",
            "The tracking link in your email gives me '{error}', so I have no idea where my parcel is. Can you just tell me the delivery status of order {order}?",
            "I don't want to cancel or get a refund, I still want the {product}. Please just send the missing item from order {order}.",
            "I can log in and see order {order}, but it says 'in transit' since {day}. Has it been lost by {carrier}?",
        ],
    },
    "technical": {
        "normal": [
            "The app crashes every time I open {screen} on my {device}. I'm on version {version}.",
            "I keep getting '{error}' when I try to {action}. I've cleared my cache and tried again.",
            "The login page just shows a blank white screen in {browser}. Other websites load fine.",
            "Sync between the desktop app and my {device} stopped working after the last update.",
            "Your API returns '{error}' for POST /v2/orders even though the API key is valid.",
            "The checkout button does nothing when I click it. The browser console shows '{error}'.",
            "Push notifications stopped working on my {device} {when}. They're enabled in the phone settings.",
            "Exporting a report to CSV produces an empty file, even though the report shows data on screen.",
            "Pages are extremely slow today, it takes about 30 seconds to open {screen}.",
            "After I log in, the site sends me straight back to the login page, over and over. It happens in {browser} and in the app.",
            "Photos won't upload, the progress bar gets stuck at 99% and then shows '{error}'.",
            "Since version {version} the {integration} integration disconnects every few hours and I have to reconnect it.",
            "Can you add more detail to the error message? All it says is '{error}' when I try to {action}, so I can't tell what's wrong.",
            "Search returns no results, even for products I know are in the catalogue.",
            "The text on {screen} is unreadable in dark mode, it's dark grey on black.",
            "Webhook deliveries to our endpoint have been failing with a timeout since {day}. Nothing changed on our side.",
            "My cart empties itself every time I refresh the page, so I can't {action}.",
            "The invoice PDF cuts off the last line item and the total. Happens with every invoice I download.",
            "The app on my {device} shows '{error}' on startup and then closes. Reinstalling didn't help.",
            "The date picker in {browser} shows the wrong month, so every appointment gets saved one month off.",
        ],
        "terse": [
            "app won't open on my {device}",
            "getting '{error}' again",
            "is the site down?",
            "{integration} sync broken since {version}",
            "blank page after login in {browser}",
            "can't {action}, spinner forever",
            "Checkout button dead in {browser}.",
            "error when I {action}: {error}",
        ],
        "ambiguous": [
            "Not sure if this is a billing thing, but {screen} throws '{error}' whenever I open it, so I can't see anything there.",
            "I tried to reset my password like your help page says, but the reset form itself crashes with '{error}' before I can submit it.",
            "The payment page shows '{error}' when I press Pay, so I can't finish my order. My card is fine, it's the page that breaks.",
            "It would be great to have a Linux app someday, but right now the Windows app won't even start after the {version} update.",
            "My order went through, but the order confirmation page shows '{error}' and the order is missing from my order history in the app.",
        ],
    },
    "account": {
        "normal": [
            "I forgot my password and the reset email never arrives. I've checked spam too.",
            "How do I change the email address on my account from {email} to {email2}?",
            "My account got locked after too many login attempts. Can you unlock it?",
            "I'd like to delete my account and all the data you have about me.",
            "I lost my phone and can't get the two-factor code anymore. How do I get back into my account?",
            "Can you add my colleague {name} to our team workspace as an admin? Their email is {email}.",
            "I have two accounts by mistake, {email} and {email2}. Can you merge them into one?",
            "I got an alert that someone logged into my account from {country}. That wasn't me. Please help me secure it.",
            "How can I change my username? The one I picked when I signed up is embarrassing.",
            "I signed up with Google, but now I want to log in with an email and password instead. Is that possible?",
            "Please transfer ownership of our workspace to {name} ({email}), I'm leaving the company on {day}.",
            "I can't log in, it says my account has been deactivated. I never deactivated it myself.",
            "Please remove {name} from our account, they no longer work with us and shouldn't have access.",
            "How do I update the phone number on my profile? The old number is no longer mine.",
            "It says 'invalid password' even after I reset it twice. I'm typing it exactly as I set it.",
            "How do I stop the marketing emails? I want to keep my account, just fewer emails.",
            "My account was set up as a business account by mistake. How do I switch it back to a personal one?",
            "I never received the verification email when I signed up, so my account still says 'unverified'.",
            "My name is spelled wrong on my profile and I can't edit it. It should be {fullname}.",
            "Our company changed its domain, so all {n} of our users need their login emails moved from @{domain} to the new domain. How do we do that?",
        ],
        "terse": [
            "reset password pls",
            "cant log in, locked out",
            "change my email to {email}",
            "delete my account",
            "2FA code not arriving",
            "add {email} to our team",
            "how do I change my username",
            "verification email never came",
        ],
        "ambiguous": [
            "I want to update my credit card, but first I need to get into my account: the password reset link says 'expired' every single time I click it.",
            "I don't need a refund or anything, I just want my account closed and my personal data deleted before the next renewal.",
            "Your app works fine, the problem is that I can't log in because the two-factor codes go to my old phone number. Please change it.",
            "I'd love a family plan someday, but for now: how do I give my partner their own login on our shared account?",
            "The order I placed {when} shows under my old email. Please move my order history and login to {email}.",
        ],
    },
    "feature_request": {
        "normal": [
            "It would be great if you could add {feature}.",
            "Any plans to support {feature}? It's the one thing keeping us from upgrading to {plan}.",
            "Can you add {feature}? I'd use it every day.",
            "Feature suggestion: {feature}. Other stores I shop at already have it.",
            "Please consider adding {feature}. I mostly use the app on my {device}.",
            "I love the product, but I really miss {feature}.",
            "Would you consider letting customers {feature_verb}?",
            "Is {feature} on your roadmap? We'd happily test a beta.",
            "Our team would pay more for {feature}. Right now we work around it with spreadsheets.",
            "Small idea: let us {feature_verb}. It would save me a few clicks every day.",
            "Not a bug, just a request: {feature}.",
            "Adding my vote for {feature}, people have been asking for it in the community forum for ages.",
            "Would love to see {feature} in the next update!",
            "Why is there still no {feature}? Every other app has it by now.",
            "It'd save us so much time if we could {feature_verb}.",
            "When an order ships, it would be nice to have {feature}. Just a thought for a future version.",
            "Suggestion from a long-time {plan} customer: {feature}. Happy to explain our use case on a call.",
            "Everything works well, my only wish is to be able to {feature_verb}.",
            "Have you thought about {feature}? It would make the app much more useful for families like mine.",
            "Please make it possible to {feature_verb}. The current way is really clunky.",
        ],
        "terse": [
            "pls add {feature}",
            "dark mode when?",
            "need {feature}",
            "request: {feature}",
            "let us {feature_verb}",
            "any ETA on {feature}?",
            "{feature} would be nice",
            "+1 for {feature}",
        ],
        "ambiguous": [
            "The tracking works fine and my parcel arrived on time, but it would be great if you added {feature}.",
            "Billing is all sorted, thanks. One request though: could you let us {feature_verb}?",
            "No bug here, the export works. I'd just love {feature} so I don't have to export at all.",
            "I was going to ask for a refund because I miss {feature}, but honestly I'd rather you just build it. Any chance?",
            "Login with a password works, but can you add {feature}? Typing long passwords on my {device} is a pain.",
        ],
    },
}

# Extra sentences that make a ticket longer; each category has its own, plus neutral ones.
DETAILS: dict[str, list[str]] = {
    "billing": [
        "I've attached a screenshot of the bank statement.",
        "Our books close at the end of the month, so I need this sorted soon.",
        "The charge appeared on the card ending in {card}.",
        "I checked the billing page and it doesn't explain the amount.",
        "Please send the corrected invoice to {email}.",
        "We're a small business, so every unexpected charge matters.",
    ],
    "refund": [
        "I've kept the original packaging and the receipt.",
        "This is the second time I've had to ask for this.",
        "The money went out on the card ending in {card}.",
        "Your return policy says I'm still within the window.",
        "The order was placed under {email}.",
        "I'd prefer not to go through my bank for a chargeback, but I will if I have to.",
    ],
    "shipping": [
        "The tracking page hasn't changed since {day}.",
        "I've already asked my neighbours and the building manager.",
        "It's a birthday present, so the date really matters.",
        "You can reach me at {email} if the courier needs anything.",
        "The shipping confirmation email came, but nothing after that.",
        "I live in a building with a locked front door, so the driver needs to call me.",
    ],
    "technical": [
        "I've tried logging out and back in, and reinstalling the app.",
        "It happens on wifi and on mobile data.",
        "My colleague has the same problem on a different computer.",
        "My login is {email}, in case you need to check the logs.",
        "It started right after your update {when}.",
        "I can send a screen recording if that helps.",
    ],
    "account": [
        "I still have access to my email inbox.",
        "I can confirm my identity with the last four digits of my card, {card}.",
        "I've been a member since {year}, so it's an old account.",
        "Nobody else should have access to this account.",
    ],
    "feature_request": [
        "I know it's probably not a priority, but it would make a real difference for us.",
        "Other tools we use already offer this.",
        "Feel free to contact me at {email} if you want more details.",
        "Happy to give feedback on a prototype.",
        "I've mentioned this to your sales rep as well.",
        "Keep up the good work, the app is great otherwise.",
    ],
}
# Longer background sentences: they turn a ticket into a paragraph.
STORIES: dict[str, list[str]] = {
    "billing": [
        "We budget for software once a year, so surprise charges in the middle of the quarter cause real problems with our accountant and I have to explain every single one of them.",
        "I looked through every email you sent me over the last few months and none of them mentioned a change in how or when I would be billed.",
        "Our office manager usually handles payments, but she is on leave until the end of the month, so I'm trying to sort out the billing side myself.",
        "For what it's worth, I've been happy with the service itself, this is only about the money side and making sure our records match yours.",
        "Last year the same thing happened and it took three emails to get a corrected invoice, so I would appreciate a clear answer this time.",
        "I need to forward the corrected numbers to our finance team before Friday, otherwise the payment run goes out with the wrong figures.",
    ],
    "refund": [
        "I have been a loyal customer for a long time and have never asked for my money back before, so I hope this can be handled quickly and without a lot of back and forth.",
        "I followed every step on your returns page, printed the label, dropped the parcel at the post office and kept the receipt with the tracking number.",
        "Your chat assistant told me the money would be back within five business days, and it has now been more than two weeks with nothing on my statement.",
        "I'd really rather not open a dispute with my bank, because that seems unfair to a small shop, but I need the money for other bills this month.",
        "Money is tight this month, and waiting on this amount means I have to move other payments around, which is stressful.",
        "The item itself was fine, it just wasn't right for me, and your policy page made it sound like getting paid back would be simple.",
    ],
    "shipping": [
        "I took a day off work to be at home for the delivery and nobody came, and the tracking page still shows the same status as it did three days ago.",
        "The order contains a present for my mother's seventieth birthday, so if it doesn't arrive in time I will need to buy something else locally instead.",
        "I called the carrier twice and both times they told me to contact the sender, which is you, so I'm hoping you can find out what is happening with it.",
        "My building has a parcel room but the concierge says nothing came in under my name or my flat number this week.",
        "The last two orders I placed came on time, so I'm surprised this one is taking so long, and the estimate on the website keeps changing.",
        "I work nights, so daytime deliveries are hard for me, but I left clear instructions in the delivery notes when I placed the order.",
    ],
    "technical": [
        "I've tried it on two different computers, with and without browser extensions, in a private window, and after restarting the router, and the result is exactly the same every time.",
        "This worked perfectly until a few days ago, so I assume something changed on your side, because I haven't installed anything new or changed any settings.",
        "We rely on this every morning for our stand-up meeting, so the whole team is blocked until it works again and we've had to fall back to email.",
        "I'm happy to share logs or hop on a quick screen share with one of your engineers if that makes it easier to reproduce the problem.",
        "The status page says all systems are operational, but clearly something is broken, because two of my coworkers see the same thing on their machines.",
        "I'm not very technical, so I may be describing this badly, but I followed the troubleshooting steps in your help center one by one and nothing changed.",
    ],
    "account": [
        "I've had this account for years and it has all my order history and saved addresses, so I really don't want to create a new one and start over.",
        "I'm a bit worried about security because I use the same email for my bank, so please let me know if anything else was changed on the account.",
        "I went through the help articles about logins and profiles, but none of them covers my situation and the options they mention aren't visible for me.",
        "I can answer any security questions you need, or send a photo of my ID, if that helps confirm that I am really the owner of the account.",
        "My partner set the account up originally, years ago, so some of the details on it may be outdated, including the security questions.",
        "Our IT department asked me to get this sorted before our audit next month, since every person with access has to be accounted for.",
    ],
    "feature_request": [
        "We're a team of designers and we've built a whole spreadsheet workaround for this, which works, but it takes one of us about an hour every week to keep up to date.",
        "I mentioned this in your last customer survey as well, and a few friends who also use the app told me they would love to have the same thing.",
        "I understand you have a long list of priorities, and I'm not complaining, the product is great, I just think this would make it even better for a lot of people.",
        "If it helps, I'd be glad to join a beta or a short interview to describe how we would use it in our daily work.",
        "I run a small shop and I use the app every day, so even a simple version of this would save me a lot of repetitive clicking.",
        "I tried a browser extension that does something similar, but it is clunky and I would much rather have it built into your product.",
    ],
}
NEUTRAL_STORIES = [
    "I've been using Lumen & Pine for years, both the app and the shop, and this is honestly the first time I've had to write to support about anything.",
    "I tried to reach you through the chat on the website first, but it kept saying all agents were busy, so I'm sending this by email instead.",
    "Sorry if this is the wrong place to ask, I couldn't find a contact form that matched my question, so I picked the general support address.",
    "I'm writing on behalf of my elderly father, who set everything up with my help, so please reply to this address and I will pass it on to him.",
    "Please reply by email rather than phone, I'm in meetings most of the day this week and can't take calls until the evening.",
    "I run a small bakery and use your products for both the shop and the office, so this affects my work as well as my own purchases.",
]
NEUTRAL_CONTEXT = [
    "I've been a customer for {years} years.",
    "I'm on the {plan} plan.",
    "My account email is {email}.",
    "I'm writing from my phone, sorry for any typos.",
    "I already tried your help center.",
    "This is for our team of {n} people.",
    "I'm using the app on my {device}.",
    "I ordered from you {when}.",
]
GREETINGS = [
    "Hi,", "Hello,", "Hey team,", "Hi there,", "Good morning,", "Dear support,", "Hello Lumen & Pine,",
    "Hi support team,", "Hey,", "Good afternoon,", "Hi {agent},",
]
SIGNOFFS = [
    "Thanks,\n{first}", "Thank you!", "Cheers", "Regards,\n{fullname}", "Best,\n{first}", "Thx",
    "Thanks in advance.", "Kind regards,\n{fullname}", "- {first}", "Many thanks, {first}",
]
POLITE = [
    "Sorry to bother you with this.", "Any help would be much appreciated.",
    "Thanks so much for your help!", "I hope you can help.", "No rush, but I'd like to get this sorted.",
]
ANGRY = [
    "This is ridiculous.", "I am extremely frustrated.", "This is the third time I'm writing about this!!",
    "Fix this now.", "Honestly, this is unacceptable.", "Really disappointed right now.",
    "I expect an answer today.", "Terrible experience so far.",
]
ANGRY_OPENERS = ["I am extremely frustrated.", "Really disappointed right now.", "Terrible experience so far."]
TYPOS = {
    "receive": "recieve", "received": "recieved", "definitely": "definately", "account": "acount",
    "address": "adress", "separate": "seperate", "because": "becuase", "really": "realy",
    "which": "wich", "tomorrow": "tommorow", "immediately": "immediatly", "password": "pasword",
}

WORD_RE = re.compile(r"[a-z0-9']+")
END_OF_SENTENCE = re.compile(r"(?<=[a-z)])\.(?=\s+[A-Z]|$)")  # not "$12.50", "no. 123", ".com"
A_BEFORE_VOWEL = re.compile(r"\ba (?=(?:espresso|air|office|electric|iPhone|iPad|iMac|Android)\b)")


def words(text: str) -> list[str]:
    return WORD_RE.findall(text.lower())


# --------------------------------------------------------------------------- filling


def _money(value: float, style: str) -> str:
    """Format an amount in one of the styles a customer might type."""
    whole = value == int(value)
    num = f"{value:,.0f}" if whole else f"{value:,.2f}"
    if style == "usd_code":
        return f"{num} USD"
    if style == "plain":
        return num
    return style + num


def _amount_pair(rng: random.Random) -> tuple[str, str]:
    """Two amounts in the same currency, the second one smaller (quote vs charge, etc.)."""
    x = float(rng.choice([rng.randint(5, 60), rng.randint(20, 200), rng.randint(100, 2400)]))
    if rng.random() < 0.6:
        x += rng.choice([0.99, 0.5, rng.randint(1, 98) / 100])
    y = round(x * rng.uniform(0.55, 0.92), rng.choice([0, 2]))
    style = rng.choice(["$", "$", "$", "$", "usd_code", "€", "£", "plain"])
    return _money(x, style), _money(y, style)


def _order(rng: random.Random) -> str:
    n = rng.randint(10000, 999999)
    return rng.choice([f"#{n}", f"#{n}", str(n), f"LP-{n}", f"ORD-{n}", f"no. {n}"])


def _when(rng: random.Random) -> str:
    return rng.choice([
        "yesterday", "last week", "two weeks ago", f"last {rng.choice(WEEKDAYS)}",
        f"on {rng.choice(MONTHS)} {rng.randint(1, 28)}", f"on the {_ordinal(rng.randint(1, 28))}",
        "this morning", f"on {rng.randint(1, 12)}/{rng.randint(1, 28)}", "a few days ago",
        f"on {rng.choice(WEEKDAYS)}", "last month",
    ])


def _day(rng: random.Random) -> str:
    return rng.choice([
        f"{rng.choice(MONTHS)} {rng.randint(1, 28)}", rng.choice(WEEKDAYS), f"the {_ordinal(rng.randint(1, 28))}",
        f"{rng.randint(1, 28)} {rng.choice(MONTHS)[:3]}", "next week", "the weekend",
    ])


def _ordinal(n: int) -> str:
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _email(rng: random.Random) -> str:
    first, last = rng.choice(FIRST_NAMES).lower(), rng.choice(LAST_NAMES).lower()
    local = rng.choice([f"{first}.{last}", f"{first}{rng.randint(1, 99)}", f"{first[0]}{last}", first])
    return f"{local}@{rng.choice(EMAIL_DOMAINS)}"


def _product(rng: random.Random) -> str:
    p = rng.choice(PRODUCTS)
    return f"{rng.choice(COLORS)} {p}" if rng.random() < 0.25 else p


SLOTS = {
    "order": _order,
    "when": _when,
    "day": _day,
    "email": _email,
    "product": _product,
    "plan": lambda r: r.choice(PLANS),
    "month": lambda r: r.choice(MONTHS + ["last month"]),
    "invoice": lambda r: r.choice(["INV-", "#", "LP-INV-", ""]) + str(r.randint(1000, 99999)),
    "company": lambda r: r.choice(COMPANIES),
    "street_address": lambda r: f"{r.randint(2, 980)} {r.choice(STREETS)}",
    "city": lambda r: r.choice(CITIES),
    "n": lambda r: str(r.randint(3, 25)),
    "k": lambda r: str(r.randint(1, 2)),
    "coupon": lambda r: r.choice(COUPONS),
    "error": lambda r: r.choice(ERRORS),
    "device": lambda r: r.choice(DEVICES),
    "browser": lambda r: r.choice(BROWSERS),
    "version": lambda r: f"{r.randint(3, 6)}.{r.randint(0, 19)}.{r.randint(0, 9)}",
    "action": lambda r: r.choice(ACTIONS),
    "screen": lambda r: r.choice(SCREENS),
    "integration": lambda r: r.choice(INTEGRATIONS),
    "name": lambda r: f"{r.choice(FIRST_NAMES)} {r.choice(LAST_NAMES)}",
    "fullname": lambda r: f"{r.choice(FIRST_NAMES)} {r.choice(LAST_NAMES)}",
    "first": lambda r: r.choice(FIRST_NAMES),
    "agent": lambda r: r.choice(FIRST_NAMES),
    "country": lambda r: r.choice(COUNTRIES),
    "carrier": lambda r: r.choice(CARRIERS),
    "feature": lambda r: r.choice(FEATURES),
    "feature_verb": lambda r: r.choice(FEATURE_VERBS),
    "domain": lambda r: r.choice(["brightpath.example", "harbor-dental.example", "orbit.example"]),
    "card": lambda r: f"{r.randint(0, 9999):04d}",
    "year": lambda r: str(r.randint(2014, 2023)),
    "years": lambda r: str(r.randint(2, 9)),
}
SLOT_RE = re.compile(r"\{([a-z_]+?)(\d?)\}")


def fill(template: str, rng: random.Random, values: dict[str, str]) -> str:
    """Fill {slot} / {slot2} placeholders; `values` collects what was used (shared per ticket)."""

    def one(m: re.Match) -> str:
        key = m.group(1) + m.group(2)
        if key not in values:
            base = m.group(1)
            if base == "amount":
                values["amount"], values["amount2"] = _amount_pair(rng)
                return values[key]
            if base == "email" and "name" in values and not m.group(2):
                first, last = values["name"].lower().split(" ", 1)
                values[key] = f"{first}.{last}@{rng.choice(EMAIL_DOMAINS)}"
                return values[key]
            taken = {v for k, v in values.items() if k.rstrip("0123456789") == base}
            for _ in range(50):
                v = SLOTS[base](rng)
                if v not in taken:
                    break
            if base == "n" and m.group(2):  # n2 > n keeps "billed for n2, we have n" sensible
                values.setdefault("n", SLOTS["n"](rng))
                v = str(int(values["n"]) + rng.randint(1, 6))
            values[key] = v
        return values[key]

    return SLOT_RE.sub(one, template)


def slots_of(template: str) -> set[str]:
    return {m.group(1) + m.group(2) for m in SLOT_RE.finditer(template)}


def fresh(pool: list[str], values: dict[str, str]) -> list[str]:
    """Sentences of `pool` that don't repeat a slot the ticket already uses."""
    return [s for s in pool if not slots_of(s) & values.keys()]


def add_typos(text: str, rng: random.Random) -> str:
    tokens = text.split(" ")
    candidates = [i for i, t in enumerate(tokens) if t.isalpha() and len(t) >= 5]
    if not candidates:
        return text
    for i in rng.sample(candidates, min(len(candidates), rng.choice([1, 1, 2]))):
        t = tokens[i]
        if t.lower() in TYPOS:
            tokens[i] = TYPOS[t.lower()]
            continue
        j = rng.randint(1, len(t) - 2)
        op = rng.choice(["swap", "drop", "double"])
        if op == "swap":
            t = t[:j] + t[j + 1] + t[j] + t[j + 2 :]
        elif op == "drop":
            t = t[:j] + t[j + 1 :]
        else:
            t = t[:j] + t[j] + t[j:]
        tokens[i] = t
    return " ".join(tokens)


def make_ticket(label: str, kind: str, rng: random.Random) -> tuple[str, tuple]:
    """Build one ticket -> (text, key); the key identifies template + slot values."""
    templates = TEMPLATES[label][kind]
    t_index = rng.randrange(len(templates))
    values: dict[str, str] = {}
    body = fill(templates[t_index], rng, values)
    key = (label, kind, t_index, tuple(sorted(values.items())))

    if kind == "terse":
        if rng.random() < 0.55:
            body = body.lower()
        if rng.random() < 0.3 and not body.endswith(("?", ".")):
            body += rng.choice(["?", ".", " asap", " thanks", "!!"])
        if rng.random() < 0.12:
            body = fill(rng.choice(GREETINGS), rng, values) + " " + body
        return body, key

    tone = rng.choices(["neutral", "polite", "angry"], weights=[55, 28, 17])[0]
    sentences = [body]
    sentences_raw: list[str] = []
    n_details = rng.choices([0, 1, 2], weights=[48, 36, 16])[0]
    for _ in range(n_details):
        pool = [p for p in fresh(DETAILS[label], values) if p not in sentences_raw]
        if pool:
            sentences_raw.append(rng.choice(pool))
            sentences.append(fill(sentences_raw[-1], rng, values))
    if rng.random() < 0.28:
        story = rng.choice(STORIES[label] if rng.random() < 0.65 else NEUTRAL_STORIES)
        sentences.insert(rng.choice([1, len(sentences)]), story)
    if rng.random() < 0.3:
        pool = fresh(NEUTRAL_CONTEXT, values)
        if pool:
            sentences.insert(rng.choice([0, 1]), fill(rng.choice(pool), rng, values))
    if tone == "polite":
        sentences.append(rng.choice(POLITE))
    elif tone == "angry":
        angry = rng.choice(ANGRY)
        sentences.insert(rng.choice([0, len(sentences)]) if angry in ANGRY_OPENERS else len(sentences), angry)
    text = " ".join(sentences)
    if tone == "angry" and rng.random() < 0.3:
        text = END_OF_SENTENCE.sub("!", text, count=1)
    if rng.random() < 0.08:
        text = add_typos(text, rng)

    if rng.random() < 0.45:
        sep = rng.choice(["\n\n", " ", "\n"])
        text = fill(rng.choice(GREETINGS), rng, values) + sep + text
    if rng.random() < (0.2 if tone == "polite" else 0.38):
        sep = rng.choice(["\n\n", "\n", " "])
        text = text + sep + fill(rng.choice(SIGNOFFS), rng, values)
    return A_BEFORE_VOWEL.sub("an ", text), key


def jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def generate(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    plan: list[tuple[str, str]] = []
    for label in LABELS:
        kinds = (
            ["ambiguous"] * AMBIGUOUS_PER_LABEL
            + ["terse"] * TERSE_PER_LABEL
            + ["normal"] * (PER_LABEL - AMBIGUOUS_PER_LABEL - TERSE_PER_LABEL)
        )
        plan += [(label, k) for k in kinds]
    rng.shuffle(plan)

    seen_keys: set[tuple] = set()
    seen_texts: set[str] = set()
    accepted: list[frozenset] = []
    rows: list[dict] = []
    for label, kind in plan:
        for _attempt in range(500):
            text, key = make_ticket(label, kind, rng)
            norm = " ".join(words(text))
            if key in seen_keys or norm in seen_texts or len(text.split()) > MAX_WORDS:
                continue
            ws = frozenset(words(text))
            if any(jaccard(ws, other) >= MAX_JACCARD for other in accepted):
                continue
            break
        else:
            raise RuntimeError(f"could not make a new {kind} {label} ticket; add templates")
        seen_keys.add(key)
        seen_texts.add(norm)
        accepted.append(ws)
        rows.append({"label": label, "text": text, "kind": kind})

    return [
        {"id": f"t{i:04d}", "text": r["text"], "label": r["label"], "_kind": r["kind"]}
        for i, r in enumerate(rows, start=1)
    ]


def write(rows: list[dict], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / FILENAME
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            obj = {"id": r["id"], "text": r["text"], "label": r["label"]}
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    return path


def _percentile(sorted_values: list[int], q: float) -> int:
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def stats(rows: list[dict]) -> str:
    lines = [f"tickets: {len(rows)}", "", "per label (all / of which ambiguous / terse):"]
    for label in LABELS:
        mine = [r for r in rows if r["label"] == label]
        amb = sum(r["_kind"] == "ambiguous" for r in mine)
        terse = sum(r["_kind"] == "terse" for r in mine)
        lines.append(f"  {label:<16} {len(mine):>4} / {amb:>2} / {terse:>2}")
    n_words = sorted(len(r["text"].split()) for r in rows)
    mean = sum(n_words) / len(n_words)
    lines += [
        "",
        "length in words (whitespace-separated):",
        f"  min {n_words[0]}  p10 {_percentile(n_words, 0.1)}  p25 {_percentile(n_words, 0.25)}"
        f"  median {_percentile(n_words, 0.5)}  p75 {_percentile(n_words, 0.75)}"
        f"  p90 {_percentile(n_words, 0.9)}  max {n_words[-1]}  mean {mean:.1f}",
    ]
    buckets = [(1, 11), (12, 20), (21, 40), (41, 60), (61, 80), (81, 150)]
    for lo, hi in buckets:
        n = sum(lo <= w <= hi for w in n_words)
        lines.append(f"  {lo:>3}-{hi:<3} words: {n:>4}  {'#' * round(60 * n / len(n_words))}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data",
                        help=f"folder to write {FILENAME} into (default: data/ beside this script)")
    parser.add_argument("--seed", type=int, default=SEED, help=f"random seed (default {SEED})")
    parser.add_argument("--stats", action="store_true", help="print counts and length distribution")
    args = parser.parse_args(argv)
    rows = generate(args.seed)
    path = write(rows, args.out)
    print(f"wrote {len(rows)} tickets to {path}")
    if args.stats:
        print(stats(rows))


if __name__ == "__main__":
    main()
