-- Revenue per day, currency and status, from deduplicated orders.
select
    order_date,
    currency,
    status,
    count(*) as orders,
    sum(amount) as revenue,
    sum(items) as items
from {{ ref('stg_orders') }}
group by order_date, currency, status
